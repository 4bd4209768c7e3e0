"""`accelerate launch` for ./launch.sh, minus the launcher's own traceback when a rank fails: the rank already
printed its error (one line for a user error, headstart/errors.py), and torchrun logs which rank exited how.

    python -m headstart.launch [accelerate launch arguments] script.py [script arguments]
"""

from __future__ import annotations

import subprocess
import sys


def main(argv: list[str]) -> int:
    from accelerate.commands.launch import launch_command, launch_command_parser
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    args = launch_command_parser().parse_args(argv)
    try:
        launch_command(args)
    except ChildFailedError as e:  # several processes (torchrun): the first failure's exit code
        failures = list(e.failures.values())
        return failures[0].exitcode if failures and failures[0].exitcode > 0 else 1
    except subprocess.CalledProcessError as e:  # one process (accelerate's simple launcher)
        return e.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
