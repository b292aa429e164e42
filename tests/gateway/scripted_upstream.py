"""A scripted model upstream speaking OpenAI chat completions and Anthropic
messages, streamed and not, with usage fields. A test double for a remote
model service (the model is out of scope); it records what it received so
tests can check what reached it. Model names script behaviour:
`slow-*` waits SLOW_SECONDS before answering; `full-*` reports usage as
large as a gateway's worst-case estimate of the call (every byte of the
request a token, and all of max_tokens), so a budget test's calls spend
what they reserve. It can lie and stall: `liar-*` reports LIE_TOKENS in and
LIE_TOKENS out whatever max_tokens said; `hang-*` takes the request and
answers after HANG_SECONDS (a stuck upstream); `drip-*` answers slowly: a
whole answer after DRIP_SECONDS, a stream of DRIP_WORDS chunks spread over
DRIP_SECONDS (usage in its last event, as the real APIs do)."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SLOW_SECONDS = 4.0
OUTPUT_TOKENS = 7
LIE_TOKENS = 5000
HANG_SECONDS = 30.0
DRIP_SECONDS = 1.6
DRIP_WORDS = 8


class Upstream:
    def __init__(self):
        self.requests = []
        self.lock = threading.Lock()
        self.arrived = threading.Event()
        up = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *a):
                pass

            def do_POST(self):
                n = int(self.headers.get("content-length", "0"))
                raw = self.rfile.read(n)
                body = json.loads(raw or b"{}")
                rec = {"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                       "body": body, "size": len(raw)}
                with up.lock:
                    up.requests.append(rec)
                up.arrived.set()
                model = str(body.get("model", ""))
                self.pause = 0.0
                if model.startswith("slow-"):
                    time.sleep(SLOW_SECONDS)
                if model.startswith("hang-"):
                    time.sleep(HANG_SECONDS)
                input_tokens = max(1, len(raw) // 8)
                output_tokens = min(OUTPUT_TOKENS, body.get("max_tokens") or body.get("max_completion_tokens") or 10**9)
                if model.startswith("full-"):
                    input_tokens = len(raw)
                    output_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or OUTPUT_TOKENS
                if model.startswith("liar-"):
                    input_tokens = output_tokens = LIE_TOKENS
                if model.startswith("drip-"):
                    output_tokens = min(DRIP_WORDS, output_tokens)
                    if body.get("stream"):
                        self.pause = DRIP_SECONDS / DRIP_WORDS
                    else:
                        time.sleep(DRIP_SECONDS)
                # What it is about to report (a test compares the charge).
                rec["reported"] = (input_tokens, output_tokens)
                if self.path.endswith("/chat/completions"):
                    self.openai(body, input_tokens, output_tokens)
                elif self.path.endswith("/messages"):
                    self.anthropic(body, input_tokens, output_tokens)
                else:
                    self.send_response(404)
                    self.send_header("content-length", "0")
                    self.end_headers()

            def whole(self, obj):
                data = json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def sse_start(self):
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()

            def chunk(self, text):
                if self.pause:
                    time.sleep(self.pause)
                data = text.encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            def sse_end(self):
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

            def openai(self, body, i, o):
                words = ["hello"] * min(o, 64)
                if not body.get("stream"):
                    return self.whole({
                        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": body["model"],
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": " ".join(words)}}],
                        "usage": {"prompt_tokens": i, "completion_tokens": o, "total_tokens": i + o}})
                self.sse_start()
                for w in words:
                    self.chunk("data: " + json.dumps({
                        "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": body["model"],
                        "choices": [{"index": 0, "delta": {"content": w + " "}, "finish_reason": None}]}) + "\n\n")
                if (body.get("stream_options") or {}).get("include_usage"):
                    self.chunk("data: " + json.dumps({
                        "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": body["model"],
                        "choices": [], "usage": {"prompt_tokens": i, "completion_tokens": o, "total_tokens": i + o}})
                        + "\n\n")
                self.chunk("data: [DONE]\n\n")
                self.sse_end()

            def anthropic(self, body, i, o):
                text = " ".join(["hello"] * min(o, 64))
                msg = {"id": "msg_1", "type": "message", "role": "assistant", "model": body["model"],
                       "stop_reason": "end_turn", "stop_sequence": None}
                if not body.get("stream"):
                    return self.whole(dict(msg, content=[{"type": "text", "text": text}],
                                           usage={"input_tokens": i, "output_tokens": o}))
                self.sse_start()

                def ev(name, obj):
                    self.chunk(f"event: {name}\ndata: {json.dumps(obj)}\n\n")
                ev("message_start", {"type": "message_start", "message": dict(
                    msg, content=[], stop_reason=None, usage={"input_tokens": i, "output_tokens": 1})})
                ev("content_block_start", {"type": "content_block_start", "index": 0,
                                           "content_block": {"type": "text", "text": ""}})
                ev("content_block_delta", {"type": "content_block_delta", "index": 0,
                                           "delta": {"type": "text_delta", "text": text}})
                ev("content_block_stop", {"type": "content_block_stop", "index": 0})
                ev("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn",
                                                                        "stop_sequence": None},
                                     "usage": {"output_tokens": o}})
                ev("message_stop", {"type": "message_stop"})
                self.sse_end()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
