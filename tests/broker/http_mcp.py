"""An MCP server over streamable HTTP (the real `mcp` SDK from PyPI, under
uvicorn) for the broker's HTTP transport. argv: PORT TOKEN MODE LOG;
MODE `sse` answers requests as event streams (the SDK's default), `json`
as single JSON bodies. Every request must carry `Authorization: Bearer
TOKEN` (the header the operator's config gives the broker; agents never
see it): others get 401. Each tool call is logged to LOG.

Two tools speak on the session's GET stream (the SDK sends a server's own
messages there, not on a request's stream): `grow` adds the tool `late`
and sends notifications/tools/list_changed; `ask` sends a
sampling/createMessage request and returns how the client answered."""

import sys

import anyio
import mcp_types as types
import uvicorn
from mcp.server.mcpserver import Context, MCPServer

PORT, TOKEN, MODE, LOG = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
server = MCPServer("web")


@server.tool(name="echo", description="Echoes its text.", structured_output=False)
def echo(text: str) -> str:
    with open(LOG, "a") as f:
        f.write(f"echo {text}\n")
    return f"{MODE}: {text}"


GROWN = []


def late(text: str) -> str:
    with open(LOG, "a") as f:
        f.write(f"late {text}\n")
    return f"late: {text}"


@server.tool(name="grow", description="Adds the tool late; says so on the GET stream.", structured_output=False)
async def grow(ctx: Context) -> str:
    if not GROWN:
        server.add_tool(late, name="late", description="Added by grow.", structured_output=False)
        GROWN.append(True)
    # No related request: the SDK sends it on the standalone (GET) stream.
    await ctx.session.send_notification(types.ToolListChangedNotification())
    # The broker's listener takes it before the agent's next call.
    await anyio.sleep(1)
    return "grown"


@server.tool(name="ask", description="Asks the client to sample a model, on the GET stream.", structured_output=False)
async def ask(ctx: Context) -> str:
    with open(LOG, "a") as f:
        f.write("ask\n")
    try:
        with anyio.fail_after(10):
            r = await ctx.session.create_message(
                [types.SamplingMessage(role="user", content=types.TextContent(type="text", text="hi"))],
                max_tokens=5)
        return f"sampled: {r}"
    except TimeoutError:
        return "no answer"
    except Exception as e:  # the client's JSON-RPC error
        return f"refused: {e}"


app = server.streamable_http_app(json_response=(MODE == "json"))


async def guarded(scope, receive, send):
    if scope["type"] == "http":
        auth = dict(scope["headers"]).get(b"authorization", b"")
        if auth != f"Bearer {TOKEN}".encode():
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"no token"})
            return
    await app(scope, receive, send)


uvicorn.run(guarded, host="127.0.0.1", port=PORT, log_level="warning")
