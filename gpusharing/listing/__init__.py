"""The budget listing contract between the timekeeper and its readers (`GET /api/v1/budgets`, and one budget's status,
`GET /api/v1/budgets/{name}`), as report.py is the meter's: the timekeeper builds these objects and turns them to
JSON once, where its API answers; the webhook and the admin command line read its answers back through them.

A body that is no listing is refused with ListingError, which says what is wrong; within a listing, a field missing or
unreadable reads as unsaid (None, or empty) and a nested object the reader cannot use whole reads as absent, so that a
timekeeper of another version costs a reader that field and no more (docs/design/core.md).
"""


from gpusharing.listing.budgets import BudgetListing, DefaultBudget, FairShareListing, ListedBudget, listing_of
from gpusharing.listing.parts import (
    BudgetWarning,
    FairShareLevel,
    FairShareStanding,
    IdleHold,
    IdleInForce,
    IdleRule,
    Uncommitted,
)
from gpusharing.listing.values import ListingError

__all__ = [
    "BudgetListing",
    "BudgetWarning",
    "DefaultBudget",
    "FairShareLevel",
    "FairShareListing",
    "FairShareStanding",
    "IdleHold",
    "IdleInForce",
    "IdleRule",
    "ListedBudget",
    "ListingError",
    "Uncommitted",
    "listing_of",
]
