"""Mount a tmpfs, then exec a command on it: ``python -m tests.faults._in_tmpfs DIR SIZE -- ARGV...``.

Run under ``unshare -m --propagation private`` (root), so the mount exists only in the
command's own mount namespace and vanishes with it.
"""

from __future__ import annotations

import os
import subprocess
import sys


def main(argv: list[str]) -> None:
    directory, size, sep, *command = argv
    assert sep == "--" and command
    os.makedirs(directory, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "none", directory], check=True)
    os.execv(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
