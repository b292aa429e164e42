"""An MCP server over streamable HTTP (the real `mcp` SDK from PyPI, under
uvicorn) for the broker's HTTP transport. argv: PORT TOKEN MODE LOG;
MODE `sse` answers requests as event streams (the SDK's default), `json`
as single JSON bodies. Every request must carry `Authorization: Bearer
TOKEN` (the header the operator's config gives the broker; agents never
see it): others get 401. Each tool call is logged to LOG."""

import sys

import uvicorn
from mcp.server.mcpserver import MCPServer

PORT, TOKEN, MODE, LOG = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
server = MCPServer("web")


@server.tool(name="echo", description="Echoes its text.", structured_output=False)
def echo(text: str) -> str:
    with open(LOG, "a") as f:
        f.write(f"echo {text}\n")
    return f"{MODE}: {text}"


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
