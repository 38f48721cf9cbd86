"""``verl-events gather RUN --ray ADDRESS --out DIR``: a run kept on each node's own disk, in one folder.

* :mod:`.command`: the command (its arguments, output and exit codes);
* :mod:`.cluster`: every node of the Ray cluster asked through Ray, one pinned task each
  (the only module that imports Ray);
* :mod:`.node`: what runs on each node: its folder of the run, the files to bring;
* :mod:`.folder`: the gathered folder, how the nodes' copies of one path are merged,
  and its manifest.
"""

from .command import add_command, command, gather
from .folder import MANIFEST, GatherInputError

__all__ = ["MANIFEST", "GatherInputError", "add_command", "command", "gather"]
