"""The taskhost MCP scenario, driven by an independent client: the Python
`mcp` SDK (pinned: mcp==2.3.0), over stdio or streamable HTTP.

Usage: python3 mcp_scenario.py <taskhost binary> <legacy|auto> <work dir> [<http url> <token>]

Without a URL the script launches `taskhost serve` over stdio itself; with
one it connects to a running `taskhost serve --http` with the bearer token
(whose server must have `[serve] progress_interval_ms = 100`).

`legacy` forces the initialize handshake; `auto` (the SDK's default) probes
`server/discover` first and adopts the newest protocol both sides speak.
Exits non-zero with the failed assertion on any mismatch.
"""

import os
import sys

import anyio
import httpx2
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client


def text_blocks(result):
    return [block.text for block in result.content]


def only_text(result):
    blocks = text_blocks(result)
    assert len(blocks) == 1, f"expected one block, got {blocks!r}"
    return blocks[0]


def connection(binary: str, work: str, url: str | None, token: str | None):
    if url is not None:
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"})
        return streamable_http_client(url, http_client=http)
    # Written and trusted (`taskhost trust`, in the test's own state
    # directory, XDG_STATE_HOME) by the Rust side: it lies in the server's
    # working directory, where a model's commands could have planted it.
    config = os.path.join(work, "python.toml")
    return StdioServerParameters(
        command=binary,
        args=["serve", "--config", config],
        cwd=work,
        env={"RUST_LOG": "info,taskhost=debug", "XDG_STATE_HOME": os.environ["XDG_STATE_HOME"]},
    )


async def scenario(binary: str, mode: str, work: str, url: str | None, token: str | None) -> None:
    transport = "http" if url else "stdio"
    async with Client(connection(binary, work, url, token), mode=mode) as client:
        print(f"mode={mode} transport={transport} protocol={client.protocol_version}")
        if mode == "legacy":
            assert client.protocol_version < "2026-07-28", client.protocol_version
        else:
            # auto discovers the stateless era, which taskhost serves too.
            assert client.protocol_version >= "2026-07-28", client.protocol_version
        assert client.instructions and client.instructions.startswith("# Background tasks"), client.instructions

        tools = (await client.list_tools()).tools
        names = sorted(tool.name for tool in tools)
        assert names == ["bash", "task_input", "task_kill", "task_list", "task_output", "task_wait", "ticker"], names
        for tool in tools:
            assert tool.input_schema.get("type") == "object", (tool.name, tool.input_schema)
        ticker = next(tool for tool in tools if tool.name == "ticker")
        assert ticker.input_schema["properties"]["run_in_background"]["type"] == "boolean"

        assert only_text(await client.call_tool("task_list", {})) == "(no background tasks)"

        started = await client.call_tool("ticker", {"count": 3, "interval_ms": 100, "run_in_background": True})
        assert not started.is_error
        assert only_text(started) == "started background ticker task ticker-1", text_blocks(started)
        waited = only_text(await client.call_tool("task_output", {"task_id": "ticker-1", "wait": True}))
        assert waited == "tick 1\ntick 2\ntick 3\n[status: completed, ticks: 3]", waited

        # An unreported finish: the notice arrives once, on the next result.
        await client.call_tool("ticker", {"count": 1, "interval_ms": 1, "run_in_background": True})
        await anyio.sleep(0.4)
        with_notice = text_blocks(await client.call_tool("task_list", {}))
        assert len(with_notice) == 2, with_notice
        assert with_notice[1] == (
            "background task ticker-2 (ticker: 1 ticks every 1 ms) finished [status: completed, ticks: 1]. "
            "Read its output with task_output."
        ), with_notice
        assert len(text_blocks(await client.call_tool("task_list", {}))) == 1

        # Kill.
        await client.call_tool("ticker", {"count": 1000, "interval_ms": 1000, "run_in_background": True})
        assert only_text(await client.call_tool("task_kill", {"task_id": "ticker-3"})) == (
            "requested cancellation of task ticker-3"
        )
        killed = only_text(await client.call_tool("task_output", {"task_id": "ticker-3", "wait": True}))
        assert killed == "(no new output)\n[status: killed, after 0 ticks]", killed

        # Errors are tool results the model can read.
        unknown = await client.call_tool("task_output", {"task_id": "ticker-42"})
        assert unknown.is_error
        assert only_text(unknown).startswith("unknown task id ticker-42"), text_blocks(unknown)
        bad = await client.call_tool("ticker", {"count": "many"})
        assert bad.is_error and only_text(bad).startswith("invalid arguments for ticker"), text_blocks(bad)

        # The default bash tool: a background command, its stderr section and exit code.
        bash = next(tool for tool in tools if tool.name == "bash")
        assert bash.input_schema["required"] == ["command"], bash.input_schema
        started = await client.call_tool(
            "bash", {"command": "echo one; echo two >&2; exit 4", "run_in_background": True}
        )
        assert only_text(started) == "started background bash task bash-1", text_blocks(started)
        finished = only_text(await client.call_tool("task_output", {"task_id": "bash-1", "wait": True}))
        # The host drains each stream as it writes, so which came first is
        # the pipes' order; either way a header marks each stream.
        assert finished in (
            "one\n[stderr]\ntwo\n[status: completed, exit code: 4]",
            "[stderr]\ntwo\n[stdout]\none\n[status: completed, exit code: 4]",
        ), finished

        # A foreground call with a progress token gets progress notifications.
        progress = []

        async def on_progress(value, total, message):
            progress.append((value, message))

        foreground = await client.call_tool(
            "ticker", {"count": 5, "interval_ms": 100}, progress_callback=on_progress
        )
        assert only_text(foreground) == "tick 1\ntick 2\ntick 3\ntick 4\ntick 5\n[status: completed, ticks: 5]"
        assert len(progress) >= 2, progress
        assert all(later[0] > earlier[0] for earlier, later in zip(progress, progress[1:])), progress
        assert progress[0][1].startswith("ticker running for"), progress

        # Beyond the three tools: a milestone notice, views, task_wait.
        started = await client.call_tool(
            "bash",
            {
                "command": "echo warming; sleep 0.2; echo 'listening on 4242'; sleep 30",
                "run_in_background": True,
                "notify_on": {"pattern": "listening on \\d+"},
            },
        )
        assert only_text(started) == "started background bash task bash-2", text_blocks(started)
        notice = None
        for _ in range(100):
            blocks = text_blocks(await client.call_tool("task_list", {}))
            if len(blocks) == 2:
                notice = blocks[1]
                break
            await anyio.sleep(0.1)
        assert notice is not None, "no milestone notice rode on a result"
        assert notice.startswith("background task bash-2 (bash: echo warming; sleep 0.2;"), notice
        assert notice.endswith(
            "printed a line matching /listening on \\d+/: listening on 4242 — still running. "
            "Read its output with task_output."
        ), notice
        tail = only_text(await client.call_tool("task_output", {"task_id": "bash-2", "view": "tail", "lines": 1}))
        assert tail == "listening on 4242\n[status: running]", tail
        grep = only_text(await client.call_tool("task_output", {"task_id": "bash-2", "grep": "^listen"}))
        assert grep == "2: listening on 4242\n[status: running]", grep
        read = only_text(await client.call_tool("task_output", {"task_id": "bash-2"}))
        assert read == "warming\nlistening on 4242\n[status: running]", read

        await client.call_tool("ticker", {"count": 1, "interval_ms": 50, "run_in_background": True})
        waited = only_text(await client.call_tool("task_wait", {"task_ids": ["bash-2", "ticker-4"], "timeout_ms": 10000}))
        assert waited.startswith("ticker-4 finished first\nbash-2 [bash] running — echo warming"), waited
        assert waited.endswith("\nticker-4 [ticker] completed — 1 ticks every 50 ms"), waited
        none = only_text(await client.call_tool("task_wait", {"task_ids": ["bash-2"], "timeout_ms": 50}))
        assert none.startswith("none finished within 50 ms\nbash-2 [bash] running"), none
        refused = await client.call_tool("task_input", {"task_id": "bash-2", "text": "x"})
        assert refused.is_error and only_text(refused).startswith(
            "task bash-2 was started without interactive: true"
        ), text_blocks(refused)
        await client.call_tool("task_kill", {"task_id": "bash-2"})

        # Input to an interactive command.
        started = await client.call_tool(
            "bash",
            {"command": "while read line; do echo \"got $line\"; done; echo bye", "run_in_background": True, "interactive": True},
        )
        assert only_text(started) == "started background bash task bash-3", text_blocks(started)
        sent = only_text(await client.call_tool("task_input", {"task_id": "bash-3", "text": "hello\n"}))
        assert sent == "sent 6 bytes to task bash-3", sent
        answered = ""
        for _ in range(100):
            answered += only_text(await client.call_tool("task_output", {"task_id": "bash-3"})).rsplit("\n", 1)[0]
            if "got hello" in answered:
                break
            await anyio.sleep(0.05)
        assert "got hello" in answered, answered
        # The loop ends as soon as its input closes: its completion notice may
        # already ride on this result (a notice goes on the next result).
        closed = text_blocks(await client.call_tool("task_input", {"task_id": "bash-3", "close": True}))
        assert closed[0] == "sent 0 bytes to task bash-3 and closed its input", closed
        assert all(block.startswith("background task bash-3 (bash: ") for block in closed[1:]), closed
        ended = text_blocks(await client.call_tool("task_output", {"task_id": "bash-3", "wait": True}))[0]
        assert ended.endswith("bye\n[status: completed, exit code: 0]"), ended
    print(f"mode={mode} transport={transport}: ok")


if __name__ == "__main__":
    binary, mode, work = sys.argv[1], sys.argv[2], sys.argv[3]
    url, token = (sys.argv[4], sys.argv[5]) if len(sys.argv) > 5 else (None, None)
    anyio.run(scenario, binary, mode, work, url, token)
