"""What `vllm serve BASE --enable-lora --max-lora-rank R --lora-modules NAME=ADAPTER
[--served-model-name BASE_NAME] --port P` does, where vLLM cannot run (CI has no GPU): one
OpenAI-compatible server for the base model and its adapters, each in toolself's own engine,
routing each request by its `model` as vLLM does (the base by its served name, else its path;
an adapter by its name; any other name is a 404). An adapter is checked on start as vLLM checks
a static LoRA module: a LoRA adapter of rank at most R, where R is one of the ranks vLLM's
LoRA config accepts (`MaxLoRARanks`; any other value fails the server's start).

A GPU is held while a server runs: with STANDIN_LEDGER set, the server appends when it started
and stopped there (one JSON line each), so that a test can see which servers ran when.

    python tests/vllm_standin.py serve BASE --enable-lora --max-lora-rank 16 --lora-modules rft=DIR --port 8001
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path


# vLLM's `MaxLoRARanks` (vllm/config/lora.py): the values --max-lora-rank may take.
MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def standin_executable(folder: Path) -> Path:
    """`folder/vllm`: a command that runs this stand-in as `vllm` runs (`vllm serve ...`)."""
    command = folder / "vllm"
    command.write_text(f"#!/bin/sh\nexec {sys.executable} {Path(__file__).resolve()} \"$@\"\n")
    command.chmod(0o755)
    return command


def check_adapter(name: str, path: Path, max_rank: int) -> str | None:
    config_file = path / "adapter_config.json"
    if not config_file.is_file() or not (path / "adapter_model.safetensors").is_file():
        return f"LoRA module {name}: {path} holds no adapter_config.json and adapter_model.safetensors"
    config = json.loads(config_file.read_text())
    if config.get("peft_type") != "LORA":
        return f"LoRA module {name}: peft_type is {config.get('peft_type')!r}, not LORA"
    if int(config.get("r", 0)) > max_rank:
        return f"LoRA module {name}: LoRA rank {config['r']} is greater than max_lora_rank {max_rank}"
    return None


def router(apps: dict, listing: list[dict]):
    """An ASGI app that hands each chat request to the app of the model it names."""

    async def send_json(send, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        if scope["path"] == "/v1/models":
            return await send_json(send, 200, {"object": "list", "data": listing})
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        try:
            name = json.loads(body).get("model")
        except (ValueError, AttributeError):
            name = None
        if name not in apps:
            return await send_json(send, 404, {"object": "error", "message": f"The model `{name}` does not exist.",
                                               "type": "NotFoundError", "param": None, "code": 404})
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await apps[name](scope, replay, send)

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("model")
    parser.add_argument("--enable-lora", action="store_true")
    parser.add_argument("--max-lora-rank", type=int, default=16, choices=MAX_LORA_RANKS)
    parser.add_argument("--lora-modules", nargs="+", default=[])
    parser.add_argument("--served-model-name", nargs="+", default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    adapters = dict(module.split("=", 1) for module in args.lora_modules)
    if adapters and not args.enable_lora:
        sys.exit("--lora-modules needs --enable-lora")
    for name, path in adapters.items():
        problem = check_adapter(name, Path(path), args.max_lora_rank)
        if problem:
            sys.exit(problem)

    import uvicorn

    from toolself.models.spec import ModelSpec
    from toolself.serve import create_app

    def load(path: str):
        spec = ModelSpec.parse(f"local:{path}")
        return spec.load(**spec.options())

    base_name = args.served_model_name[0] if args.served_model_name else args.model
    names = [base_name, *adapters]
    ledger = os.environ.get("STANDIN_LEDGER")

    def note(event: str) -> None:
        if ledger:
            with open(ledger, "a") as f:
                f.write(json.dumps({"event": event, "names": names, "port": args.port, "time": time.time()}) + "\n")

    note("start")  # vLLM takes its share of the GPU's memory as it starts
    try:
        models = {base_name: load(args.model), **{name: load(path) for name, path in adapters.items()}}
        apps = {name: create_app(model, served_name=name) for name, model in models.items()}
        listing = [{"id": name, "object": "model", "owned_by": "vllm", "root": adapters.get(name, args.model),
                    "parent": None if name == base_name else base_name} for name in names]
        server = uvicorn.Server(uvicorn.Config(router(apps, listing), host=args.host, port=args.port,
                                               lifespan="off", log_level="warning"))
        server.capture_signals = contextlib.nullcontext  # uvicorn would re-raise SIGTERM and skip the note
        for stop in (signal.SIGTERM, signal.SIGINT):
            signal.signal(stop, lambda *_: setattr(server, "should_exit", True))
        server.run()
    finally:
        note("stop")


if __name__ == "__main__":
    main()
