"""What the export commands share: a document written as JSON to a file or to standard output."""

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError


def json_write(command: BaseCommand, document: Any, output: Path | None) -> None:
    """`document` as indented JSON to `output`, or to the command's standard output; CommandError if unwritable."""
    text = json.dumps(document, indent=2, ensure_ascii=False) + "\n"
    try:
        if output:
            output.write_text(text)
        else:
            command.stdout.write(text, ending="")
    except OSError as exc:
        raise CommandError(str(exc)) from exc
