"""The CLI's side of completed tasks: ``add --retain``, ``ack --result``,
``wait``, ``list --state done`` and how a done task is shown, against the
module's real server."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import cli, cli_json, unique

from delaywheel.cli.tasks import STATES as CLI_STATES
from delaywheel.engine.task import STATES


def test_the_cli_knows_every_state() -> None:
    assert CLI_STATES == STATES


def test_add_retain_ack_result_wait_and_list_done(address: str) -> None:
    topic, task_id = unique("cli"), unique("c")
    added = cli(address, "add", "--topic", topic, "--id", task_id, "--retain", "1h")
    assert added.exit_code == 0, added.output
    assert cli_json(address, "reserve", topic)["retain"] == 3600
    acked = cli(address, "ack", task_id, "--result", '{"rows": 3, "raw": {"$bin": "AAE="}}')
    assert acked.exit_code == 0 and f"acked {task_id}" in acked.output
    task = cli_json(address, "wait", task_id, "--timeout", "5s")
    assert task["state"] == "done" and task["outcome"] == "acked"
    assert task["result"] == {"rows": 3, "raw": {"$bin": "AAE="}}  # bytes, as JSON shows them
    shown = cli(address, "get", task_id)
    assert shown.exit_code == 0
    for row in ("state:     done", "retain:    1h", "outcome:   acked", 'result:    {"rows": 3'):
        assert row in shown.output, shown.output
    listed = cli_json(address, "list", "--topic", topic, "--state", "done")
    assert [t["id"] for t in listed["tasks"]] == [task_id]
    kicked = cli(address, "kick", "--id", task_id)
    assert kicked.exit_code != 0 and "it is done, not dead" in kicked.output


def test_wait_times_out_and_bad_results_are_refused(address: str) -> None:
    topic = unique("cli")
    task_id = cli_json(address, "add", "--topic", topic, "--delay", "1h")["id"]
    waited = cli(address, "wait", task_id, "--timeout", "0.2s")
    assert waited.exit_code == 1 and f"{task_id} is not done after" in waited.output
    bad = cli(address, "ack", task_id, "--result", "{nope")
    assert bad.exit_code == 2 and "'--result': not JSON" in bad.output
    missing = cli(address, "wait", unique("none"))
    assert missing.exit_code == 1 and "not found" in missing.output


def test_import_takes_retain_as_a_duration(address: str, tmp_path: Path) -> None:
    topic = unique("cli")
    lines = tmp_path / "tasks.jsonl"
    lines.write_text(json.dumps({"topic": topic, "id": f"{topic}-i", "retain": "2h"}) + "\n")
    imported = cli(address, "import", str(lines))
    assert imported.exit_code == 0, imported.output
    assert cli_json(address, "get", f"{topic}-i")["retain"] == 7200
