"""The one config system: schemas, key-path errors, overrides, ${PRIVASR_DATA}, the resolved dict."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest

from privasr.config import (
    Context,
    apply_overrides,
    expand_vars,
    from_mapping,
    parse_overrides,
    read_config,
    setting,
    to_dict,
)
from privasr.errors import ConfigError


@dataclass(frozen=True)
class Inner:
    rate: float = setting(0.5, gt=0.0, lt=1.0)
    kind: Literal["a", "b"] = "a"
    names: tuple[str, ...] = ()


@dataclass(frozen=True)
class Entry:
    path: Path | None = setting(None, exists="file")
    order: int = setting(3, min=1, max=10)

    @classmethod
    def __config_value__(cls, value: Any, where: str) -> Any:
        return {"path": value} if isinstance(value, str) else value


@dataclass(frozen=True)
class Outer:
    name: str
    seed: int = setting(0, min=0)
    flag: bool = True
    inner: Inner = field(default_factory=Inner)
    maybe: Inner | None = None
    entries: dict[str, Entry] = field(default_factory=dict)
    free: Any = None
    method: str = setting("x", choices=("x", "y"))

    def __config_check__(self, where: str, ctx: Context) -> Outer | None:
        if self.method == "y" and not self.entries:
            raise ConfigError("method y needs entries", expected="entries: {NAME: PATH}")
        return dataclasses.replace(self, name=self.name.strip())


def test_defaults_nesting_and_resolution(tmp_path):
    f = tmp_path / "a.arpa"
    f.write_text("x")
    cfg = from_mapping(Outer, {"name": " run ", "inner": {"rate": 0.25, "names": ["p", "q"]},
                               "entries": {"e": str(f)}, "maybe": None, "free": {"k": [1]}})
    assert cfg.name == "run" and cfg.seed == 0 and cfg.flag is True
    assert cfg.inner == Inner(0.25, "a", ("p", "q")) and cfg.maybe is None
    assert cfg.entries["e"] == Entry(f, 3) and cfg.free == {"k": [1]}
    d = to_dict(cfg)
    assert d["entries"] == {"e": {"path": str(f), "order": 3}} and d["inner"]["names"] == ["p", "q"]
    assert from_mapping(Outer, d) == cfg  # the resolved dict reads back to the same config


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ({}, "config key 'name' is missing"),
        ({"name": "r", "nmae": 1}, "unknown config key 'nmae'"),
        ({"name": "r", "inner": {"rat": 1}}, "unknown config key 'inner.rat'"),
        ({"name": "r", "seed": -1}, "'seed' is -1 .expected an integer >= 0"),
        ({"name": "r", "seed": True}, "'seed' is True"),
        ({"name": "r", "seed": 1.0}, "'seed' is 1.0"),
        ({"name": "r", "flag": "yes"}, "'flag' is 'yes' .expected true or false"),
        ({"name": "r", "inner": {"rate": 1.0}}, "'inner.rate' is 1.0 .expected a number > 0.0 and < 1.0"),
        ({"name": "r", "inner": {"rate": float("nan")}}, "'inner.rate' is nan .expected a finite number"),
        ({"name": "r", "inner": {"kind": "c"}}, "'inner.kind' is 'c' .expected one of a, b"),
        ({"name": "r", "inner": {"names": "p"}}, "'inner.names' is 'p' .expected a list"),
        ({"name": "r", "inner": {"names": ["p", 3]}}, r"'inner.names\[1\]' is 3"),
        ({"name": "r", "inner": [1]}, "'inner' is list .expected a mapping"),
        ({"name": "r", "entries": {"e": {"order": 11}}}, "'entries.e.order' is 11 .expected an integer in .1, 10"),
        ({"name": "r", "entries": {"e": "missing.arpa"}}, "'entries.e.path': no such file"),
        ({"name": "r", "method": "z"}, "'method' is 'z' .expected one of x, y"),
        ({"name": "r", "method": "y"}, "method y needs entries"),
        ({"name": ""}, "'name' is '' .expected a non-empty string"),
    ],
)
def test_errors_name_the_key_path(raw, match):
    with pytest.raises(ConfigError, match=match):
        from_mapping(Outer, raw)


def test_file_checks_can_be_skipped():
    cfg = from_mapping(Outer, {"name": "r", "entries": {"e": "missing.arpa"}}, "", Context(check_files=False))
    assert cfg.entries["e"].path == Path("missing.arpa")


def test_top_level_must_be_a_mapping():
    with pytest.raises(ConfigError, match="the config is a list"):
        from_mapping(Outer, [1])


def test_privasr_data_is_expanded_in_paths(monkeypatch, tmp_path):
    (tmp_path / "x.arpa").write_text("x")
    monkeypatch.setenv("PRIVASR_DATA", str(tmp_path))
    cfg = from_mapping(Outer, {"name": "r", "entries": {"e": "${PRIVASR_DATA}/x.arpa"}})
    assert cfg.entries["e"].path == tmp_path / "x.arpa"
    with pytest.raises(ConfigError, match="unknown variable"):
        expand_vars("${HOME}/x")


def test_overrides_parse_and_apply():
    raw = apply_overrides({"name": "r", "inner": {"rate": 0.5}},
                          parse_overrides(["inner.rate=0.1", "inner.names=[a, b]", "seed=3"]))
    cfg = from_mapping(Outer, raw)
    assert cfg.inner.rate == 0.1 and cfg.inner.names == ("a", "b") and cfg.seed == 3
    with pytest.raises(ConfigError, match="not key=value"):
        parse_overrides(["seed"])
    with pytest.raises(ConfigError, match="not valid"):
        apply_overrides({}, {"a..b": 1})
    with pytest.raises(ConfigError, match="is not a mapping"):
        apply_overrides({"name": "r"}, {"name.x": 1})


def test_read_config_names_file_and_line(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("name: r\ninner: {rate: [\n")
    with pytest.raises(ConfigError) as e:
        read_config(p)
    assert str(p) in str(e.value) and e.value.line is not None
    p.write_text("- 1\n")
    with pytest.raises(ConfigError, match="a mapping"):
        read_config(p)
    with pytest.raises(ConfigError, match="no such config file"):
        read_config(tmp_path / "none.yaml")
    p.write_text("")
    assert read_config(p) == {}


def test_setting_rejects_unknown_rules():
    with pytest.raises(TypeError, match="unknown setting rule"):
        setting(1, minimum=0)


@dataclass(frozen=True)
class Checked:
    rate: float = 0.5

    def __post_init__(self) -> None:
        if self.rate > 0.9:
            raise ConfigError(f"rate={self.rate} is too high", expected="at most 0.9")


@dataclass(frozen=True)
class HoldsChecked:
    algo: Checked = field(default_factory=Checked)


def test_a_schemas_own_checks_name_its_section():
    with pytest.raises(ConfigError, match=r"config key 'algo': rate=0.95 is too high .expected at most 0.9"):
        from_mapping(HoldsChecked, {"algo": {"rate": 0.95}})
