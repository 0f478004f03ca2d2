"""Reading settings from environment variables, with messages that name the variable."""

from __future__ import annotations

import importlib
import os
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any


class ConfigError(ValueError):
    """A setting is missing or malformed; the message names the variable."""


def env_text(name: str, default: str | None = None, environ: Mapping[str, str] = os.environ) -> str:
    value = environ.get(name, "").strip()
    if value:
        return value
    if default is None:
        raise ConfigError(f"{name} must be set")
    return default


def env_int(name: str, default: int, minimum: int = 0, environ: Mapping[str, str] = os.environ) -> int:
    return int(_env_number(name, default, minimum, int, "a whole number", environ))


def env_float(
    name: str,
    default: float,
    minimum: float = 0.0,
    environ: Mapping[str, str] = os.environ,
    maximum: float | None = None,
) -> float:
    """A finite number of at least `minimum` (and at most `maximum`, if given); unset: `default`."""
    return _env_number(name, default, minimum, float, "a finite number", environ, maximum)


def _env_number(
    name: str, default: float, minimum: float, parse: Callable[[str], float], kind: str, environ: Mapping[str, str],
    maximum: float | None = None,
) -> float:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = parse(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} must be {kind}") from None
    if maximum is not None and not minimum <= value <= maximum:  # NaN too
        raise ConfigError(f"{name}={raw!r} must be {kind} from {minimum:g} to {maximum:g}")
    if not minimum <= value < float("inf"):
        raise ConfigError(f"{name}={raw!r} must be {kind}, at least {minimum:g}")
    return value


def refuse_retired(retired: Mapping[str, str], environ: Mapping[str, str] = os.environ) -> None:
    """ConfigError for the first setting of `retired` (old name: what to set instead) that is set: a setting no longer
    read is refused, not ignored, so an installation that still sets it learns where its value must go."""
    for name, instead in retired.items():
        if environ.get(name, "").strip():
            raise ConfigError(f"{name} is no longer read: set {instead} instead")


def env_choice(name: str, default: str, choices: tuple[str, ...], environ: Mapping[str, str] = os.environ) -> str:
    value = environ.get(name, "").strip() or default
    if value not in choices:
        raise ConfigError(f"{name}={value!r} must be one of {', '.join(choices)}")
    return value


def env_list(name: str, default: tuple[str, ...], environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """A comma-separated list; an empty variable keeps the default."""
    raw = environ.get(name)
    if raw is None or not raw.strip():
        return default
    return tuple(item.strip() for item in raw.split(",") if item.strip())


def env_flag(name: str, default: bool, environ: Mapping[str, str] = os.environ) -> bool:
    raw = environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}={raw!r} must be true or false")


def check_http_url(value: str) -> str:
    """`value` without a trailing '/'; ConfigError when it is not an http:// or https:// URL with a host."""
    try:
        parsed = urllib.parse.urlsplit(value)
        port_ok = parsed.port is None or parsed.port > 0
    except ValueError:
        port_ok = False
    if parsed.scheme not in ("http", "https") or not parsed.hostname or not port_ok:
        example = f"http://{value}" if "://" not in value and value else "http://127.0.0.1:8080"
        raise ConfigError(f"{value!r} must be an http:// or https:// URL, e.g. {example}")
    return value.rstrip("/")


def env_url(
    name: str, default: str | None = None, environ: Mapping[str, str] = os.environ, required: bool = False
) -> str | None:
    """An http(s) URL without a trailing '/'; unset: `default`, or ConfigError when `required`."""
    raw = environ.get(name, "").strip()
    if not raw:
        if required:
            raise ConfigError(f"{name} must be set")
        return default
    try:
        return check_http_url(raw)
    except ConfigError as exc:
        raise ConfigError(f"{name}={exc}") from None
def env_code(name: str, default: str, environ: Mapping[str, str] = os.environ) -> str:
    """A `module:attribute` path naming code to load later (a seam the tests set), checked for its form now."""
    value = env_text(name, default, environ)
    module, _, attribute = value.partition(":")
    if not module or not attribute:
        raise ConfigError(f"{name}={value!r} must be module:function")
    return value


def load_code(name: str, path: str) -> Any:
    """What the `module:attribute` path of setting `name` names; ConfigError naming the setting when it cannot be
    loaded."""
    module, _, attribute = path.partition(":")
    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{name}={path!r} cannot be loaded: {exc}") from None
