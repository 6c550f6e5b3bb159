"""A stand-in engine that dies of a CUDA OOM on its first start, as vLLM 0.26 does, for dataplane.py's oom step.

Why not the fake vLLM: the oom step needs the engine to *end* after a prompt-logprobs request, with vLLM's log lines
(the engine core's fatal error and torch's OutOfMemoryError) and vLLM's exit code 0, and to survive on the restart.
The marker file says whether this is the first start. Standard library only; serves /health, /metrics, /tokenize and
/v1/completions.

  python -m tests.support.oom_engine PORT MARKER_FILE
"""

from __future__ import annotations

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CACHE_INFO = ('vllm:cache_config_info{block_size="16",cache_dtype="fp8",kv_cache_size_tokens="1815904",'
              'num_gpu_blocks="113494"} 1.0\n')
OOM_LINES = ("ERROR EngineCore encountered a fatal error.",
             "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.91 GiB. GPU 0 has a total capacity of "
             "139.80 GiB of which 2.10 GiB is free.")


def main(argv: list[str]) -> int:
    port, marker = int(argv[0]), argv[1]
    first = not os.path.exists(marker)
    with open(marker, "a"):
        pass

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def answer(self, code: int, body: object, ctype: str = "application/json") -> None:
            data = (body if isinstance(body, str) else json.dumps(body)).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self.answer(200, {})
            else:
                self.answer(200, CACHE_INFO, "text/plain")

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/tokenize":
                self.answer(200, {"count": len(str(body["prompt"]).split())})
                return
            if first and body.get("prompt_logprobs"):
                for line in OOM_LINES:
                    print(line, file=sys.stderr, flush=True)
                self.answer(500, {"error": {"message": "EngineCore died"}})
                threading.Thread(target=os._exit, args=(0,)).start()  # vLLM's API server exits 0 here
                return
            self.answer(200, {"choices": [{"text": "x", "finish_reason": "length"}],
                              "usage": {"prompt_tokens": 9000, "completion_tokens": 1}})

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
