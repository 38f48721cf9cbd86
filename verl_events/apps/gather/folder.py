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
  and is listed.

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

__all__ = ["MANIFEST", "GatherInputError", "GatheredFolder", "check_out", "node_label"]

#: The manifest in the gathered folder: the source, each node's part, what was merged.
MANIFEST = "gather.json"
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

    def add(self, node: str, folder: NodeFolder) -> None:
        """Every file of ``node``'s folder, by the rules of the module docstring."""
        for file in folder.files:
            parts = Path(file.path).parts
            if not parts or Path(file.path).is_absolute() or ".." in parts:
                continue  # read_node_folder never names one: nothing outside the folder is written
            self._add(node, file)

    def _add(self, node: str, file: NodeFile) -> None:
        target = self.aside / file.path
        named = self._named.get(file.path)
        if named is None:
            self._write(target, file.data, file.mtime)
            self._named[file.path] = (node, file.mtime)
            return
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
            kept_aside = _beside(target, named[0])
            os.replace(target, kept_aside)
            self._write(target, file.data, file.mtime)
            self._named[file.path] = (node, file.mtime)
            self.renamed.append(self._renamed(file.path, kept_aside, named[0], node))
        else:
            aside = _beside(target, node)
            self._write(aside, file.data, file.mtime)
            self.renamed.append(self._renamed(file.path, aside, node, named[0]))

    def _write(self, target: Path, data: bytes, mtime: float) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        os.utime(target, (mtime, mtime))
        self.files += 1
        self.bytes += len(data)

    def _renamed(self, path: str, aside: Path, node: str, named: str) -> dict[str, str]:
        return {"path": path, "kept_as": aside.relative_to(self.aside).as_posix(), "node": node, "named": named}

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


def _beside(target: Path, node: str) -> Path:
    return target.with_name(f"{target.name}.node-{node_label(node)}")
