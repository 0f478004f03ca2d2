"""The `statements` task: each billing period, once closed and settled, stated and signed (docs/audit.md): its rows
read as leaves, their tree's root signed with the chain's key in force, the statement appended after the last one; a
new signing key handed over to by a statement the old key signs first.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass

from gpusharing.statements.merkle import EMPTY_ROOT, TreeBuilder, leaf_hash
from gpusharing.statements.note import sign_note
from timekeeper import metrics
from timekeeper.chargeback.calendar import BillingCalendar
from timekeeper.chargeback.statements import (
    ChainHead,
    SigningKeys,
    handover_statement,
    is_due,
    next_period,
    period_statement,
)
from timekeeper.database.chargeback.statements import StatementLog, WrittenStatement

log = logging.getLogger(__name__)

MAX_PERIODS_PER_RUN = 12  # a ledger with a long history is stated a year per run, each period its own transaction


@dataclass
class StatementsPass:
    periods: int = 0  # periods stated by this replica
    handed_over: bool = False
    key_unrecognised: bool = False
    rewound: bool = False  # the chain is shorter than, or other than, this replica saw it: nothing written


class StatementTask:
    def __init__(self, statements: StatementLog, calendar: BillingCalendar, origin: str, keys: SigningKeys):
        self.statements = statements
        self.calendar = calendar
        self.origin = origin
        self.keys = keys
        self._unrecognised_said = False
        self._seen: ChainHead | None = None  # the furthest head this replica has seen
        self._rewound_said = False

    def run(self, now: dt.datetime) -> StatementsPass:
        done = StatementsPass()
        head = self.statements.head()
        if self._rewound(head):
            done.rewound = True
            return done
        current = self.keys.current.verifier.text
        if head is not None and head.signer != current:
            if not self._hand_over(head, now):
                done.key_unrecognised = True
                return done
            done.handed_over = True
            head = self.statements.head()
        metrics.STATEMENT_KEY_UNRECOGNISED.set(0)
        self._unrecognised_said = False
        first_hour = self.statements.first_hour() if head is None or head.period_end is None else None
        for _ in range(MAX_PERIODS_PER_RUN):
            period = next_period(self.calendar, head.period_end if head else None, first_hour)
            if period is None or not is_due(self.calendar, period, now, self.statements.capacity_counted_until()):
                break
            log.info("closing billing period %s: stating its rows", period)
            tree, hashes = TreeBuilder(), bytearray()
            for leaf in self.statements.leaves(period.start, period.end):
                digest = leaf_hash(leaf)
                tree.append(digest)
                hashes += digest
            statement = period_statement(self.origin, head, period, tree.size, tree.root())
            note = sign_note(statement.text, [self.keys.current])
            written = WrittenStatement(statement.sequence, period, tree.size, statement.root, note, hashes,
                                       current)
            if self.statements.append(written, now):
                done.periods += 1
                metrics.STATEMENTS_WRITTEN.labels("period").inc()
                log.info("stated billing period %s: statement %d, %d rows, root %s", period, statement.sequence,
                         tree.size, statement.root.hex())
            else:
                log.info("billing period %s was stated by another replica", period)
            head = self.statements.head()
            if head is None or head.period_end is None:
                break
            metrics.STATED_UNTIL.set(head.period_end.timestamp())
        self._seen = head
        return done

    def _rewound(self, head: ChainHead | None) -> bool:
        """Whether statements this replica saw were removed or replaced since: the database was edited (or restored
        from a backup). Stating the periods again would sign whatever their rows now say, so nothing is written until
        a restart, and it is said, once, and as a metric (docs/audit.md, "What it cannot prove")."""
        seen = self._seen
        rewound = seen is not None and (head is None or head.sequence < seen.sequence or (
            head.sequence == seen.sequence and head.note_hash != seen.note_hash))
        if rewound and not self._rewound_said:
            self._rewound_said = True
            log.error("the chain of statements went back from statement %d to %s: statements were removed or "
                      "replaced in the database; none is written until the controller restarts (docs/audit.md)",
                      seen.sequence if seen else 0, head.sequence if head else "none")
        metrics.STATEMENT_CHAIN_REWOUND.set(1 if rewound else 0)
        return rewound

    def _hand_over(self, head: ChainHead, now: dt.datetime) -> bool:
        """Hands the chain over to the current key when the previous one is the key in force; False (said once, and
        as a metric) when neither is."""
        previous = self.keys.previous
        if previous is None or previous.verifier.text != head.signer:
            metrics.STATEMENT_KEY_UNRECOGNISED.set(1)
            if not self._unrecognised_said:
                self._unrecognised_said = True
                log.error("no statement is written: the chain's key in force is %s, neither the signing key %s nor "
                          "the previous key given (docs/audit.md, \"Rotating the key\")", head.signer,
                          self.keys.current.verifier.text)
            return False
        statement = handover_statement(self.origin, head, self.keys.current.verifier.text)
        note = sign_note(statement.text, [previous, self.keys.current])
        written = WrittenStatement(statement.sequence, None, 0, EMPTY_ROOT, note, None,
                                   self.keys.current.verifier.text)
        if self.statements.append(written, now):
            metrics.STATEMENTS_WRITTEN.labels("key").inc()
            log.info("statement %d hands the chain over from %s to %s", statement.sequence, head.signer,
                     self.keys.current.verifier.text)
        return True
