"""focus-validator, FOCUS 1.2's official validator, run on a CSV file from its own virtualenv (.venv-focus, which
`make focus-validator` installs, and `make tools` with it), and its verdict read from what it prints.

It exits 0 whatever it finds: its verdict is its summary line (`Total: 578 | Pass: 189 | Fail: 1 | Skipped: 388`),
one status line per rule and a list of the failures. It is told the dataset's claims (APPLICABILITY) but two, which
version 2.2.1 applies beyond what FOCUS says (MISAPPLIED); and a failure that is only the unmet alternative of a
requirement met by another (an OR rule that passed) is told apart from the dataset's failures.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from timekeeper.chargeback.focus import APPLICABILITY

VENV = Path(__file__).resolve().parents[3] / ".venv-focus"
HOW_TO_GET = "focus-validator is needed: `make focus-validator` installs it into .venv-focus (with Python 3.12)"
MISAPPLIED = {
    # It runs a rule when any one of the rule's criteria is claimed, so this claim brings in the rules for prices in
    # a virtual currency (CostAndUsage-D-047-C: PricingCurrencyContractedUnitPrice present) and their likes.
    "PUBLIC_PRICE_LIST_SUPPORTED",
    # Its ConsumedQuantity rules read CommitmentDiscountStatus, which a dataset without commitment discounts lacks.
    "USAGE_MEASUREMENT_SUPPORTED",
}
CRITERIA = tuple(criterion for criterion in APPLICABILITY if criterion not in MISAPPLIED)
SUMMARY = re.compile(r"^Total: (\d+) \| Pass: (\d+) \| Fail: (\d+) \| Skipped: (\d+)$", re.MULTILINE)
STATUS = re.compile(r"^\S+ ([A-Za-z]+-[A-Z]-\d{3}-[A-Z]): (PASS|FAIL|SKIPPED)\b", re.MULTILINE)
FAILURE = re.compile(r"^- ([A-Za-z]+-[A-Z]-\d{3}-[A-Z]): violations=[^;]*; (.*)$", re.MULTILINE)
# Without it the validator writes a 10 MB rotating log into its working directory, its site-packages.
LOGGING = "version: 1\nroot: {level: WARNING}\n"


class ValidatorError(RuntimeError):
    """The validator printed no verdict: the message has what it printed instead."""


@dataclass(frozen=True)
class Verdict:
    summary: str  # the validator's own line
    total: int
    passed: int
    failed: int
    skipped: int
    statuses: dict[str, str]  # rule id: PASS, FAIL or SKIPPED
    failures: dict[str, str]  # the dataset's failures, rule id: the validator's message
    alternatives: dict[str, str]  # failed alternatives of a requirement another alternative meets, rule id: message


def executable(venv: Path = VENV) -> Path:
    """The validator's command; the test is skipped without it, and fails under CI=true."""
    command = venv / "bin" / "focus-validator"
    if not command.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {HOW_TO_GET}", pytrace=False)
        pytest.skip(HOW_TO_GET)
    return command


def validate(data: Path, venv: Path = VENV) -> Verdict:
    """The validator's verdict on the FOCUS 1.2 CSV file at `data`."""
    command = executable(venv)
    site = next((venv / "lib").glob("python3.*/site-packages"))
    logging = data.with_name(f"{data.name}.logging.yaml")
    logging.write_text(LOGGING)
    done = subprocess.run(
        [str(command), "--data-file", str(data.resolve()), "--validate-version", "1.2", "--block-download",
         "--applicability-criteria", ",".join(CRITERIA)],
        # It reads its currency codes from focus_validator/rules/currency_codes.csv, relative to the working directory.
        cwd=site, capture_output=True, text=True, encoding="utf-8", timeout=600,
        env={**os.environ, "LOGGING_CONFIG": str(logging), "PYTHONIOENCODING": "utf-8"},
    )
    summary = SUMMARY.search(done.stdout)
    if summary is None:
        raise ValidatorError(f"focus-validator printed no `Total: … | Pass: … | Fail: …` line (exit {done.returncode})"
                             f"\nstdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}")
    statuses = dict(STATUS.findall(done.stdout))
    failed = dict(FAILURE.findall(done.stdout))
    alternatives = {rule: failed[rule] for rule in _met_otherwise(site, statuses) if rule in failed}
    total, passed, fails, skipped = (int(count) for count in summary.groups())
    return Verdict(summary.group(0), total, passed, fails, skipped, statuses,
                   {rule: message for rule, message in failed.items() if rule not in alternatives}, alternatives)


def _met_otherwise(site: Path, statuses: dict[str, str]) -> set[str]:
    """The alternatives of the OR rules that passed, read from the validator's own FOCUS 1.2 rules: it also runs each
    alternative alone and counts the unmet one as failed (an InvoiceId must be null, or not null, and is one)."""
    model = max((site / "focus_validator" / "rules").glob("model-1.2*.json"))
    rules = json.loads(model.read_text(encoding="utf-8"))["ModelRules"]
    return {
        item["ModelRuleId"]
        for rule, definition in rules.items()
        if statuses.get(rule) == "PASS" and definition["ValidationCriteria"]["Requirement"].get("CheckFunction") == "OR"
        for item in definition["ValidationCriteria"]["Requirement"]["Items"]
        if item.get("CheckFunction") == "CheckModelRule"
    }
