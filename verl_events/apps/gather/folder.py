"""The folder ``verl-events gather`` builds: every node's files in one run folder.

The nodes' files go into one tree, node after node, as a save_path shared by all of
them would have held them:

* a path that one node holds is copied as it is (per-rank files never meet: each
  rank writes its own);
* copies that are the same bytes are kept once;
* JSON lines (``.jsonl``: the files every process appends to, such as the crash
  folder's ``ends.jsonl``, the anomaly, mismatch and weight-sync logs) are merged:
  each node's lines after the previous node's, a line cut short kept on a line of
  its own;
* any other path whose copies differ keeps the newest copy under its name (the last
  write, as on a shared disk); each other copy is kept beside it as
  ``NAME.node-ID`` (the first 8 characters of its node's id), which no reader takes,
  and is listed;
* nothing is ever written over: a node's own file that has the name a copy was kept
  under, or a path that is a file on one node and a folder on another, is kept under
  the next free name (``NAME.node-ID``, then ``NAME.node-ID.2``...), and listed with why.

Every file keeps its modification time (a fatal dump's is the time of death).  The
tree is built aside (``.OUT.gathering-PID``) and put in place whole, with the manifest
(:data:`MANIFEST`) that says what came from where and what could not be reached.  An
existing ``OUT`` is replaced only when it is an earlier gather of the same source.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from .node import NodeFile, NodeFolder

__all__ = [
    "DIFFERING",
    "FILE_AND_FOLDER",
    "MANIFEST",
    "NAME_TAKEN",
    "GatherInputError",
    "GatheredFolder",
    "check_out",
    "node_label",
]

#: The manifest in the gathered folder: the source, each node's part, what was merged.
MANIFEST = "gather.json"
#: Why a copy was kept under another name (a renamed entry's ``why``).
DIFFERING = "differing copies"
NAME_TAKEN = "its name was another node's copy's"
FILE_AND_FOLDER = "a file on one node, a folder on another"
_MERGED_SUFFIX = ".jsonl"


class GatherInputError(ValueError):
    """The command's input cannot be used; the message says why and what to do."""


def node_label(node: str) -> str:
    """How a node is named in a file name and on the console: its id's first 8 characters."""
    return node[:8]


def check_out(out: Path, source: str) -> None:
    """GatherInputError unless ``out`` is missing, empty, or an earlier gather of ``source``."""
    if not out.exists():
        return
    if not out.is_dir():
        raise GatherInputError(f"--out {out} is a file; give a folder to gather into")
    if not any(out.iterdir()):
        return
    earlier = _manifest_source(out)
    if earlier != source:
        what = f"a gather of {earlier}" if earlier is not None else "files of its own"
        raise GatherInputError(
            f"--out {out} already holds {what}; give an empty or new folder (an earlier gather of the same "
            "source is replaced)"
        )


def _manifest_source(out: Path) -> str | None:
    try:
        source = json.loads((out / MANIFEST).read_text(encoding="utf-8")).get("source")
    except (OSError, ValueError, AttributeError):
        return None
    return source if isinstance(source, str) else None


class GatheredFolder:
    """The output folder under construction; :meth:`add` each node's files, then
    :meth:`finish` (or :meth:`discard`).  Not thread-safe: one command fills it."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.aside = out.parent / f".{out.name}.gathering-{os.getpid()}"
        shutil.rmtree(self.aside, ignore_errors=True)
        self.aside.mkdir(parents=True)
        self.files = 0
        self.bytes = 0
        self.merged: set[str] = set()
        self.renamed: list[dict[str, str]] = []
        # path -> (node, mtime) of the copy that holds the path's own name
        self._named: dict[str, tuple[str, float]] = {}
        # every file written, under the name it has -> its node; and every folder made
        self._taken: dict[str, str] = {}
        self._folders: dict[str, str] = {}
        # (node, folder) -> the name that node's folder was given where another node's file had its name
        self._moved: dict[tuple[str, str], str] = {}

    def add(self, node: str, folder: NodeFolder) -> None:
        """Every file of ``node``'s folder, by the rules of the module docstring."""
        for file in folder.files:
            parts = Path(file.path).parts
            if not parts or Path(file.path).is_absolute() or ".." in parts:
                continue  # read_node_folder never names one: nothing outside the folder is written
            self._add(node, file)

    def _add(self, node: str, file: NodeFile) -> None:
        named = self._named.get(file.path)
        if named is None:
            clash = self._clash(file.path)
            if clash is None:
                self._write(file.path, node, file.data, file.mtime)
                self._named[file.path] = (node, file.mtime)
            else:
                why, owner, path = clash
                if path != file.path:  # a folder of this node where another's file is: one new name for all of it
                    path = self._moved.setdefault((node, path), self._free_name(path, node)) + file.path[len(path) :]
                else:
                    path = self._free_name(path, node)
                kept = self._write(path, node, file.data, file.mtime)
                self.renamed.append(self._renamed(file.path, kept, node, owner, why))
            return
        target = self.aside / file.path
        existing = target.read_bytes()
        newest = max(file.mtime, named[1])
        if existing == file.data:
            os.utime(target, (newest, newest))
        elif file.path.endswith(_MERGED_SUFFIX):
            with target.open("ab") as out:
                if existing and not existing.endswith(b"\n"):
                    out.write(b"\n")  # a line cut short stays a line of its own
                out.write(file.data)
            os.utime(target, (newest, newest))
            self.merged.add(file.path)
            self.bytes += len(file.data)
        elif file.mtime > named[1]:
            kept = self._free_name(file.path, named[0])
            os.replace(target, self.aside / kept)
            self._taken[kept] = named[0]
            self._write(file.path, node, file.data, file.mtime)
            self._named[file.path] = (node, file.mtime)
            self.renamed.append(self._renamed(file.path, kept, named[0], node, DIFFERING))
        else:
            kept = self._write(self._free_name(file.path, node), node, file.data, file.mtime)
            self.renamed.append(self._renamed(file.path, kept, node, named[0], DIFFERING))

    def _clash(self, path: str) -> tuple[str, str, str] | None:
        """What stands where ``path`` (no copy of which is written yet) would go, as (why, the
        node whose file or folder it is, the part of ``path`` to rename), or None."""
        if path in self._taken:
            return NAME_TAKEN, self._taken[path], path
        if path in self._folders:
            return FILE_AND_FOLDER, self._folders[path], path
        parts = path.split("/")
        for end in range(1, len(parts)):
            folder = "/".join(parts[:end])
            if folder in self._taken:
                return FILE_AND_FOLDER, self._taken[folder], folder
        return None

    def _free_name(self, path: str, node: str) -> str:
        """``path.node-ID`` for ``node``'s copy, or, when that is taken, the first free
        ``path.node-ID.N``."""
        name, number = f"{path}.node-{node_label(node)}", 1
        while self._clash(name if number == 1 else f"{name}.{number}") is not None:
            number += 1
        return name if number == 1 else f"{name}.{number}"

    def _write(self, path: str, node: str, data: bytes, mtime: float) -> str:
        target = self.aside / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        os.utime(target, (mtime, mtime))
        self._taken[path] = node
        parts = path.split("/")
        for end in range(1, len(parts)):
            self._folders.setdefault("/".join(parts[:end]), node)
        self.files += 1
        self.bytes += len(data)
        return path

    def _renamed(self, path: str, kept: str, node: str, named: str, why: str) -> dict[str, str]:
        return {"path": path, "kept_as": kept, "node": node, "named": named, "why": why}

    def finish(self, manifest: dict[str, Any]) -> None:
        """Write the manifest and put the folder in place of ``out`` (an earlier gather's is removed)."""
        (self.aside / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
        old = None
        if self.out.exists():
            old = self.out.parent / f".{self.out.name}.replaced-{os.getpid()}"
            os.replace(self.out, old)
        os.replace(self.aside, self.out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def discard(self) -> None:
        shutil.rmtree(self.aside, ignore_errors=True)
