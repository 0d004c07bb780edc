"""`manage.py audit_verify`: prove the audit trail intact, or name the first row that is not."""

from django.core.management.base import BaseCommand, CommandError

from audit.integrity import audit_verify


class Command(BaseCommand):
    help = "Check every audit row's MAC and every checkpoint's signature, chain and digest."

    def handle(self, *args, **options) -> None:
        report = audit_verify()
        summary = (
            f"{report.rows_checked} rows and {report.checkpoints_checked} checkpoints checked; "
            f"{report.rows_after_last_checkpoint} rows newer than the last checkpoint rest on their MACs alone"
        )
        if report.outcomes_unknown:
            summary += (
                f"; {report.outcomes_unknown} approved calls have a completion whose outcome is unknown "
                "(their deadline passed with none recorded: neither success nor failure)"
            )
        if report.pruned_through:
            summary += f"; rows up to event {report.pruned_through} were deleted by retention"
        if report.intact:
            self.stdout.write(self.style.SUCCESS(f"Audit trail intact: {summary}."))
            return
        for problem in report.problems:
            self.stderr.write(problem)
        first = f"first tampered row: event {report.first_bad_event}; " if report.first_bad_event else ""
        raise CommandError(f"Audit trail NOT intact ({len(report.problems)} problems; {first}{summary}).")
