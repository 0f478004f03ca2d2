"""Settings from the environment: defaults when unset, one line naming the variable when malformed."""

import pytest

from gpusharing.settings.env import (
    ConfigError,
    env_choice,
    env_flag,
    env_float,
    env_int,
    env_list,
    env_text,
    env_url,
    refuse_retired,
)


def test_defaults_when_unset_or_blank() -> None:
    env = {"B": "  "}
    assert env_int("A", 3, environ=env) == 3 and env_int("B", 4, environ=env) == 4
    assert env_float("A", 0.5, environ=env) == 0.5
    assert env_list("A", ("x",), environ=env) == ("x",)
    assert env_text("A", "d", environ=env) == "d"
    assert env_flag("A", True, environ=env) is True


def test_values_are_read() -> None:
    env = {"N": "12", "F": "0.25", "L": "a, b,,c", "C": "MiB", "Y": "yes"}
    assert env_int("N", 0, environ=env) == 12
    assert env_float("F", 1.0, environ=env) == 0.25
    assert env_list("L", (), environ=env) == ("a", "b", "c")
    assert env_choice("C", "GiB", ("GiB", "MiB"), environ=env) == "MiB"
    assert env_flag("Y", False, environ=env) is True


@pytest.mark.parametrize(
    ("read", "message"),
    [
        (lambda: env_int("N", 1, environ={"N": "ten"}), "N='ten' must be a whole number"),
        (lambda: env_int("N", 1, 1, environ={"N": "0"}), "N='0' must be a whole number, at least 1"),
        (lambda: env_float("F", 1, environ={"F": "inf"}), "F='inf' must be a finite number, at least 0"),
        (lambda: env_float("F", 1, environ={"F": "nan"}), "F='nan' must be a finite number, at least 0"),
        (lambda: env_float("F", 1, 0.5, {"F": "0.4"}, maximum=2), "F='0.4' must be a finite number from 0.5 to 2"),
        (lambda: env_float("F", 1, 0.5, {"F": "2.5"}, maximum=2), "F='2.5' must be a finite number from 0.5 to 2"),
        (lambda: env_float("F", 1, 0.5, {"F": "nan"}, maximum=2), "F='nan' must be a finite number from 0.5 to 2"),
        (lambda: env_choice("C", "a", ("a", "b"), environ={"C": "z"}), "C='z' must be one of a, b"),
        (lambda: env_text("T", environ={}), "T must be set"),
        (lambda: env_flag("Y", False, environ={"Y": "maybe"}), "Y='maybe' must be true or false"),
    ],
)
def test_malformed_settings_name_the_variable(read, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as caught:
        read()
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("timekeeper:8080", "U='timekeeper:8080' must be an http:// or https:// URL, e.g. http://timekeeper:8080"),
        ("ftp://timekeeper", "U='ftp://timekeeper' must be an http:// or https:// URL, e.g. http://127.0.0.1:8080"),
        ("http://", "U='http://' must be an http:// or https:// URL"),
        ("http://timekeeper:port", "U='http://timekeeper:port' must be an http:// or https:// URL"),
    ],
)
def test_a_url_without_a_scheme_or_host_is_refused_by_every_role(raw: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        env_url("U", environ={"U": raw})
    assert str(caught.value).startswith(message)


def test_urls_lose_their_trailing_slash_and_may_be_optional_or_required() -> None:
    assert env_url("U", environ={"U": "https://tk.example:8443/"}) == "https://tk.example:8443"
    assert env_url("U", "http://d", environ={}) == "http://d"
    with pytest.raises(ConfigError, match="^U must be set$"):
        env_url("U", environ={}, required=True)


def test_a_bounded_number_may_be_either_bound() -> None:
    assert env_float("F", 1, 0.5, {"F": "0.5"}, maximum=2) == 0.5 and env_float("F", 1, 0.5, {"F": "2"}, maximum=2) == 2


def test_a_setting_no_longer_read_is_refused_saying_what_to_set_instead() -> None:
    retired = {"OLD_SECONDS": "NEW_SECONDS"}
    refuse_retired(retired, {"NEW_SECONDS": "10", "OLD_SECONDS": " "})  # unset or blank: nothing to say
    with pytest.raises(ConfigError) as refused:
        refuse_retired(retired, {"OLD_SECONDS": "10"})
    assert str(refused.value) == "OLD_SECONDS is no longer read: set NEW_SECONDS instead"
