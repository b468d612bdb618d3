"""YAML that users hand in (world configs, task files, OpenAPI documents) is read without aliases: a few
hundred bytes of nested aliases are refused in one line instead of growing without bound."""

from __future__ import annotations

import pytest
import yaml

from resilibench.cli import main
from resilibench.core.config import load_config
from resilibench.envs.real_api.live_apis import load_document, read_task_file
from resilibench.errors import InputError
from resilibench.safe_yaml import load_yaml

# The "billion laughs" of YAML: nine levels of nine aliases, 10^9 leaves from about 500 bytes.
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8))


def test_aliases_are_refused_with_their_line():
    assert len(BOMB) < 600
    with pytest.raises(yaml.YAMLError, match=r"line 2: YAML aliases \(\*a\) are not accepted"):
        load_yaml(BOMB)
    assert load_yaml("rules: {turn_limit: 12}\nkeys: [&anchor-only 1, 2]\n") == {
        "rules": {"turn_limit": 12}, "keys": [1, 2]}  # an anchor without an alias expands nothing


def test_every_user_yaml_refuses_the_bomb(tmp_path, capsys):
    config = tmp_path / "world.yaml"
    config.write_text(BOMB)
    with pytest.raises(InputError, match="YAML aliases"):
        load_config(config)
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text(BOMB)
    with pytest.raises(InputError, match="YAML aliases"):
        read_task_file(tasks)
    document = tmp_path / "openapi.yaml"
    document.write_text("openapi: 3.1.0\n" + BOMB)
    with pytest.raises(InputError, match="YAML aliases"):
        load_document(str(document))
    assert main(["run", "--config", str(config), "--limit", "1"]) == 2
    err = capsys.readouterr().err
    assert "YAML aliases" in err and len(err.strip().splitlines()) == 1
