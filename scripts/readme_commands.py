"""Print the README's quick-start command of one kind, as a newcomer would copy it.

    python scripts/readme_commands.py install    # the install-and-run command
    python scripts/readme_commands.py test       # the test command

The README marks each with an HTML comment (``<!-- ci: install -->``, ``<!-- ci: test -->``) on the
line before its code block. ``.ci/run`` runs exactly what this prints, so CI proves that the two
commands a newcomer reads are the two that pass.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
KINDS = ("install", "test")


def readme_command(kind: str, text: str) -> str:
    """The one-line command in the code block right after ``<!-- ci: KIND -->``; ValueError when
    the marker is missing, repeated, or not followed by a code block of one line."""
    found = re.findall(rf"<!-- ci: {re.escape(kind)} -->\n```[a-z]*\n(.*?)```", text, flags=re.S)
    if len(found) != 1:
        raise ValueError(
            f"README.md must mark exactly one {kind} command with <!-- ci: {kind} --> before its "
            f"code block; found {len(found)}"
        )
    lines = [line for line in found[0].splitlines() if line.strip()]
    if len(lines) != 1:
        raise ValueError(f"the README's {kind} command must be one line, got {len(lines)}")
    return lines[0].strip()


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in KINDS:
        print(f"usage: readme_commands.py {{{'|'.join(KINDS)}}}", file=sys.stderr)
        return 2
    try:
        print(readme_command(argv[0], README.read_text(encoding="utf-8")))
    except ValueError as e:
        print(f"readme_commands.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
