"""What the supported Pythons (3.10 to 3.13) do not all have, in one place: import it from here."""

from __future__ import annotations

import datetime as dt
import sys
from enum import Enum

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:

    class StrEnum(str, Enum):
        """enum.StrEnum of Python 3.11: members are their values, also to str() and format()."""

        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return format(str(self.value), spec)



def from_iso(text: str) -> dt.datetime:
    """datetime.fromisoformat, also of RFC 3339's `Z` (as the API and the timekeeper write UTC), which 3.10 refuses."""
    return dt.datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)


__all__ = ["StrEnum", "from_iso"]
