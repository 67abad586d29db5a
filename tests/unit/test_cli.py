"""The command line's own checks: --port takes only a TCP port (70000 listened on 4464 before), and
check-config finds the GGUF files a config names that are missing or are no GGUF (it said ok)."""

from __future__ import annotations

import pytest

from appliance.cli import main
from conftest import SMOLLM2


@pytest.mark.parametrize("port", ["70000", "0", "-1", "x1"])
def test_serve_refuses_a_port_that_is_none(port, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["serve", "--config", str(tmp_path / "unread.yaml"), "--port", port])
    assert e.value.code == 2 and "is not a port number (1-65535)" in capsys.readouterr().err


def test_check_config_names_each_model_file_that_is_missing_or_no_gguf(tmp_path, capsys, real_models):
    (tmp_path / "notes.txt").write_text("not a model")
    config = tmp_path / "c.yaml"
    config.write_text(f"model_dir: {tmp_path}\nmodels:\n"
                      "  - {name: a, path: nope.gguf}\n"
                      "  - {name: b, path: notes.txt}\n"
                      f"  - {{name: c, path: {SMOLLM2}, lora: [{{name: l, path: gone.gguf}}]}}\n"
                      f"  - {{name: d, path: {SMOLLM2}}}\n")
    assert main(["check-config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "3 problem(s)" in err
    assert "models[0].path: " in err and "No such file" in err
    assert "models[1].path: " in err and "is not a GGUF file" in err
    assert "models[2].lora[0].path: " in err and "models[3]" not in err
    config.write_text(f"models:\n  - {{name: d, path: {SMOLLM2}}}\n")
    assert main(["check-config", str(config)]) == 0 and "ok" in capsys.readouterr().out


def test_check_config_finds_what_serve_would_not_start_with(tmp_path, capsys, real_models):
    # a key file missing or unreadable, an audit path that is a directory, a plugin that does not
    # load: check-config said ok, serve refused to start
    (tmp_path / "bad.keys").write_text("garbage\n")
    config = tmp_path / "c.yaml"
    for lines, needle in (("server: {api_key_file: missing.keys}", "server.api_key_file: cannot read key file"),
                          ("server: {api_key_file: bad.keys}", "server.api_key_file: "),
                          (f"audit: {{path: {tmp_path}}}", "audit.path: "),
                          ("policy: {strategy: 'plugin:nonexistent.so'}", "policy.strategy: cannot load plugin"),
                          ("policy: {strategy: 'plugin:no_such_module:X'}", "policy.strategy: cannot import")):
        config.write_text(f"{lines}\nmodels:\n  - {{name: d, path: {SMOLLM2}}}\n")
        assert main(["check-config", str(config)]) == 2, lines
        err = capsys.readouterr().err
        assert "1 problem(s)" in err and needle in err, (lines, err)
