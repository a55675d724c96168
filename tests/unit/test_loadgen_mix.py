"""Request mixes from inline specs and files, and the messages for bad ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batchpilot.loadgen.mix import format_mix, parse_mix
from batchpilot.models import RequestClass, RequestMix


def test_inline_spec_gives_weighted_classes_in_order() -> None:
    mix = parse_mix("8:16, 2:256")
    assert mix == RequestMix(
        classes=(RequestClass(weight=8, size=16), RequestClass(weight=2, size=256))
    )


def test_bare_size_means_weight_one() -> None:
    assert parse_mix("32").classes == (RequestClass(weight=1, size=32),)


def test_format_is_the_inverse_of_parse() -> None:
    mix = parse_mix("8:16,2:256,0.5:4096")
    assert parse_mix(format_mix(mix)) == mix


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("8:x", "size in mix item '8:x' must be an integer"),
        ("a:1", "weight in mix item 'a:1' must be a number"),
        ("0:5", "weight must be > 0"),
        ("1:0", "size an integer in 1..65536"),
        ("1:70000", "size an integer in 1..65536"),
        ("8:16,,2:4", "empty item"),
        ("", "empty request mix"),
        ("1:2.5", "must be an integer"),
        ("inf:4", "weight must be a finite number"),
    ],
)
def test_bad_inline_specs_say_what_is_wrong(spec: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=r"WEIGHT:SIZE|weight|size|empty") as info:
        parse_mix(spec)
    assert fragment in str(info.value)


def test_yaml_file_with_list(tmp_path: Path) -> None:
    path = tmp_path / "mix.yaml"
    path.write_text("- {weight: 8, size: 16}\n- {weight: 2, size: 256}\n")
    assert [c.size for c in parse_mix(str(path)).classes] == [16, 256]


def test_json_file_with_requests_key_as_in_the_custom_resource(tmp_path: Path) -> None:
    path = tmp_path / "mix.json"
    path.write_text(json.dumps({"requests": [{"weight": 3, "size": 1}, {"size": 64}]}))
    mix = parse_mix(str(path))
    assert mix.classes == (RequestClass(weight=3, size=1), RequestClass(weight=1, size=64))


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("[]", "non-empty list"),
        ("- {weight: 1}\n", "must be a mapping with 'size'"),
        ("- {size: 1, colour: red}\n", "must be a mapping with 'size'"),
        ("- {weight: -1, size: 4}\n", "weight must be > 0"),
        ("a: [b\n", "is not valid"),
    ],
)
def test_bad_files_say_what_is_wrong(tmp_path: Path, content: str, fragment: str) -> None:
    path = tmp_path / "mix.yaml"
    path.write_text(content)
    with pytest.raises(ValueError, match=r"mix\.yaml") as info:
        parse_mix(str(path))
    assert fragment in str(info.value)


def test_missing_file_is_reported_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"cannot read request mix file .*absent\.yaml"):
        parse_mix(str(tmp_path / "absent.yaml"))
