"""The `ninfer` command: run (default), serve, bench, convert, plugins, make-tiny.

The flags are a contract (DESIGN.md): tests and benchmarks call them. Every error a user can
cause prints one sentence on stderr and exits with code 2; `--json` prints exactly one JSON object
on stdout and nothing else there.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ninfer.errors import UserError

COMMANDS = ("run", "serve", "bench", "convert", "plugins", "make-tiny")
REGISTERED_LIKE = ("qwen3.6-27b", "qwen3.8-27b", "qwen3.6-35b-a3b")
DEFAULT_MODEL = "tiny"


# --- argument groups --------------------------------------------------------------------------------


def _model_args(p: argparse.ArgumentParser, *, prompt_free: bool = False) -> None:
    g = p.add_argument_group("model")
    g.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="registered id (qwen3.6-27b, qwen3.8-27b, qwen3.6-35b-a3b), a checkpoint directory, or "
        "'tiny' (default: a tiny random-weight checkpoint built on first use)",
    )
    g.add_argument("--weights", help="where the weights of a registered id are (else $NINFER_MODELS/<id>, then the HF cache)")
    g.add_argument("--quant", default="auto", choices=("bf16", "int4", "int8", "nvfp4", "auto"))
    g.add_argument("--spec", default="none", choices=("none", "mtp", "dflash"))
    g.add_argument("--draft-tokens", type=int, default=None, metavar="K", help="drafts a round (default 3; needs --spec)")
    g.add_argument("--lm-head-draft", action="store_true", help="draft with the shortlist head")
    g.add_argument("--max-context", type=int, default=None, metavar="N", help="tokens per sequence (default 4096)")
    g.add_argument(
        "--prefill-chunk",
        type=int,
        default=0,
        metavar="N",
        help="prompt tokens a prefill step takes (default: the largest of 16384, 8192, 4096, 2048, 1024 that fits "
        "the device beside the weights and cache, at most --max-context; 1024 on the CPU)",
    )
    g.add_argument(
        "--prefill-chunk-busy",
        type=int,
        default=0,
        metavar="N",
        help="prompt tokens a prefill step takes while other requests are decoding, which wait for it "
        "(default: 2048, at most --prefill-chunk)",
    )
    g.add_argument("--kv-dtype", default="bf16", choices=("bf16", "int8", "fp8"))
    g.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    g.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"))
    g.add_argument("--no-cuda-graph", action="store_true")
    g.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))


def _sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--greedy", action="store_true", help="exact argmax (overrides every sampling flag)")
    g.add_argument("--temperature", type=float)
    g.add_argument("--top-p", type=float)
    g.add_argument("--top-k", type=int)
    g.add_argument("--min-p", type=float)
    g.add_argument("--presence-penalty", type=float)
    g.add_argument("--frequency-penalty", type=float)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--max-new", type=int, default=128, metavar="N")
    g.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)")
    g.add_argument("--stop-token-id", action="append", type=int, default=[], metavar="ID", help="extra stop token id")
    g.add_argument("--ignore-eos", action="store_true", help="do not stop at stop token ids")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ninfer", description="Qwen3.6 / Qwen3.8 hybrid inference on one GPU.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", help="generate from a prompt (the default command)")
    _model_args(run)
    src = run.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="user message text (or raw text with --raw)")
    src.add_argument("--messages", metavar="FILE", help="JSON file: a list of messages, or {messages, tools}")
    src.add_argument("--prompt-ids", metavar="IDS", help="comma-separated token ids (implies --raw)")
    run.add_argument("--raw", action="store_true", help="skip the chat template")
    run.add_argument("--no-thinking", action="store_true", help="render the chat with thinking disabled")
    run.add_argument("--json", action="store_true", help="print one JSON object on stdout and nothing else")
    _sampling_args(run)

    serve = sub.add_parser("serve", help="OpenAI- and Anthropic-compatible HTTP server")
    _model_args(serve)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument("--api-key", help="require this key (Authorization: Bearer or x-api-key)")
    serve.add_argument("--model-id", help="the public model id (default: the checkpoint's id)")
    serve.add_argument("--max-batch", type=int, default=8, help="sequences decoded together")
    serve.add_argument("--no-thinking", action="store_true", help="thinking off unless a request turns it on")

    bench = sub.add_parser("bench", help="prefill and decode speed, with the roofline share")
    _model_args(bench)
    bench.add_argument("--random-weights", action="store_true", help="build full-size random weights on the device")
    bench.add_argument("--prompt-len", type=int, default=512)
    bench.add_argument("--gen-len", type=int, default=128)
    bench.add_argument("--concurrency", type=int, default=1)
    bench.add_argument(
        "--context-len",
        type=int,
        metavar="L",
        help="decode at this context: positions before the prompt get random K/V instead of a prefill",
    )
    bench.add_argument("--compare-transformers", action="store_true", help="also time transformers on the same bf16 weights")
    bench.add_argument("--compare-gen-len", type=int, default=8, metavar="M", help="decode steps timed on transformers")
    bench.add_argument("--json", dest="json_out", metavar="FILE", help="also write the report to FILE")

    conv = sub.add_parser("convert", help="pack a checkpoint once into a quantized directory")
    conv.add_argument("--model", required=True, help="checkpoint directory or registered id")
    conv.add_argument("--weights")
    conv.add_argument("--quant", choices=("bf16", "int4", "int8", "nvfp4"), help="the recipe to pack by")
    conv.add_argument("--out", help="output directory (with --shortlist: default the checkpoint itself)")
    conv.add_argument(
        "--shortlist", type=int, metavar="N", help="write the N-row proposal head list for --lm-head-draft instead"
    )
    conv.add_argument("--corpus", metavar="FILE", help="text the shortlist ranking runs the model over")
    conv.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))

    plug = sub.add_parser("plugins", help="what was chosen for this device, and why")
    plug.add_argument("--model", default=None)
    plug.add_argument("--weights")
    plug.add_argument("--quant", default="auto", choices=("bf16", "int4", "int8", "nvfp4", "auto"))
    plug.add_argument("--spec", default="none", choices=("none", "mtp", "dflash"))
    plug.add_argument("--device", default="auto")
    plug.add_argument("--max-context", type=int, default=None)
    plug.add_argument("--kv-dtype", default="bf16", choices=("bf16", "int8", "fp8"))
    plug.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))

    tiny = sub.add_parser("make-tiny", help="write a tiny random checkpoint in the exact HF layout")
    tiny.add_argument("--like", required=True, choices=REGISTERED_LIKE)
    tiny.add_argument("--out", required=True)
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--vocab", type=int, default=None, help="vocabulary rows (default: the real 248320)")
    tiny.add_argument("--expert-layout", default="fused", choices=("fused", "per_expert"))
    tiny.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))
    return parser


# --- helpers ----------------------------------------------------------------------------------------


def _resolve_model(model: str | None) -> str:
    """'tiny' (the default) is the embedded checkpoint, built deterministically on first use."""
    if model in (None, DEFAULT_MODEL):
        from ninfer.testing import default_tiny_path

        return str(default_tiny_path())
    return model


def engine_config(args: argparse.Namespace, *, max_batch: int = 1, default_context: int = 4096) -> Any:
    from ninfer.config import EngineConfig

    return EngineConfig(
        model=_resolve_model(args.model),
        weights=args.weights,
        quant=args.quant,
        spec=args.spec,
        draft_tokens=_draft_tokens(args),
        lm_head_draft=args.lm_head_draft,
        max_context=default_context if args.max_context is None else args.max_context,
        prefill_chunk=args.prefill_chunk,
        prefill_chunk_busy=args.prefill_chunk_busy,
        kv_dtype=args.kv_dtype,
        device=args.device,
        dtype=args.dtype,
        cuda_graph=not args.no_cuda_graph,
        max_batch=max_batch,
        random_weights=getattr(args, "random_weights", False),
    )


def _draft_tokens(args: argparse.Namespace) -> int:
    k = getattr(args, "draft_tokens", None)
    if k is None:
        return 3
    if getattr(args, "spec", "none") == "none":
        raise UserError(f"--draft-tokens {k} drafts for a speculator: add --spec mtp (or --spec dflash).", param="draft_tokens")
    return k


def sampling_params(args: argparse.Namespace, spec: Any, thinking: bool) -> Any:
    """Preset (the checkpoint's, for thinking or not) < flags < --greedy."""
    from ninfer.config import DEFAULT_STOP_TOKEN_IDS, SamplingParams, preset_fields

    fields: dict[str, Any] = preset_fields(spec.presets, thinking) if spec is not None else {}
    for flag in ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty"):
        value = getattr(args, flag)
        if value is not None:
            fields[flag] = value
    if args.greedy:
        fields["temperature"] = 0.0
    bad = [t for t in args.stop_token_id if t < 0]
    if bad:
        raise UserError(f"--stop-token-id {bad[0]} is not a token id (ids are >= 0).", param="stop_token_id")
    stop_ids = tuple(dict.fromkeys((*DEFAULT_STOP_TOKEN_IDS, *args.stop_token_id)))
    return SamplingParams(
        **fields,
        seed=args.seed,
        max_new_tokens=args.max_new,
        stop_token_ids=stop_ids,
        stop=tuple(args.stop),
        ignore_eos=args.ignore_eos,
    )


def _parse_ids(text: str) -> list[int]:
    try:
        ids = [int(part) for part in text.replace(" ", "").split(",") if part != ""]
    except ValueError:
        raise UserError(f"--prompt-ids must be comma-separated integers, got {text[:60]!r}.") from None
    if not ids:
        raise UserError("--prompt-ids is empty: give at least one token id.")
    return ids


def _read_messages(path: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"--messages {path}: no such file.") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"--messages {path}: not a readable JSON file ({exc}).") from None
    tools = None
    if isinstance(data, dict):
        tools = data.get("tools")
        data = data.get("messages")
    if not isinstance(data, list) or not data:
        raise UserError(f"--messages {path}: expected a non-empty list of messages (or an object with 'messages').")
    return data, tools


# --- commands ---------------------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    from ninfer.frontend.reasoning import ReasoningSplitter
    from ninfer.startup import build_engine

    if args.prompt is None and args.messages is None and args.prompt_ids is None:
        raise UserError("Give a prompt: --prompt TEXT, --messages FILE or --prompt-ids 1,2,3.")
    if args.max_new < 1:
        raise UserError(f"--max-new must be a positive integer, got {args.max_new}.")
    raw = args.raw or args.prompt_ids is not None
    thinking = not args.no_thinking
    # read the user's input before loading anything: a bad file fails fast
    messages = tools = None
    if args.messages is not None:
        messages, tools = _read_messages(args.messages)
    ids = _parse_ids(args.prompt_ids) if args.prompt_ids is not None else None

    engine = build_engine(engine_config(args))
    params = sampling_params(args, engine.spec, thinking)
    vocab = engine.model.shape.vocab_size
    beyond = [t for t in args.stop_token_id if t >= vocab]
    if beyond:
        raise UserError(f"--stop-token-id {beyond[0]} is outside this model's vocabulary [0, {vocab}).", param="stop_token_id")
    if ids is None:
        if raw:
            if messages is not None:
                raise UserError("--raw takes --prompt TEXT or --prompt-ids, not --messages.")
            ids = engine.tokenizer.encode(args.prompt)
        else:
            if messages is None:
                messages = [{"role": "user", "content": args.prompt}]
            text = engine.chat.render(messages, tools=tools, enable_thinking=thinking)
            ids = engine.tokenizer.encode(text)

    splitter = None if raw else ReasoningSplitter(thinking=thinking)
    token_ids: list[int] = []
    text_parts: list[str] = []
    reasoning_parts: list[str] = []
    final = None
    rid = engine.add_request(ids, params)
    while final is None:
        for out in engine.step():
            if out.request_id != rid:
                continue
            token_ids += out.new_token_ids
            delta = out.text_delta
            if splitter is not None:
                r_delta, c_delta = splitter.push(delta)
                if out.finished:
                    r_more, c_more = splitter.finish()
                    r_delta, c_delta = r_delta + r_more, c_delta + c_more
            else:
                r_delta, c_delta = "", delta
            reasoning_parts.append(r_delta)
            text_parts.append(c_delta)
            if not args.json:
                if r_delta:
                    sys.stderr.write(r_delta)
                    sys.stderr.flush()
                if c_delta:
                    sys.stdout.write(c_delta)
                    sys.stdout.flush()
            if out.finished:
                final = out
    stats = final.stats or {}
    if args.json:
        result = {
            "text": "".join(text_parts),
            "reasoning_content": None if raw else "".join(reasoning_parts),
            "token_ids": token_ids,
            "finish_reason": final.finish_reason,
            "usage": {"prompt_tokens": final.prompt_tokens, "completion_tokens": final.completion_tokens},
            "stats": {
                "prefill_tok_s": stats.get("prefill_tok_s", 0.0),
                "decode_tok_s": stats.get("decode_tok_s", 0.0),
                "spec": stats.get("spec", {"drafted": 0, "accepted": 0, "rounds": 0}),
            },
        }
        sys.stdout.write(json.dumps(result, ensure_ascii=False) + "\n")
    else:
        sys.stdout.write("\n")
        sys.stderr.write(
            f"[{final.prompt_tokens} prompt tokens, {final.completion_tokens} generated, finish {final.finish_reason}; "
            f"prefill {stats.get('prefill_tok_s', 0):.1f} tok/s, decode {stats.get('decode_tok_s', 0):.1f} tok/s]\n"
        )
    return 0


def cmd_plugins(args: argparse.Namespace) -> int:
    from ninfer.config import EngineConfig
    from ninfer.device import probe
    from ninfer.plugins import get_plugin_manager
    from ninfer.startup import plan

    pm = get_plugin_manager()
    if args.model is None:
        device = probe(args.device)
        print(f"device      {device.describe()}")
        print(f"plugins     {', '.join(pm.plugin_names())}")
        for name, why in sorted(pm.skipped.items()):
            print(f"            {name}: not loaded ({why})")
        for spec in pm.collect("ninfer_checkpoints"):
            print(f"checkpoint  {spec.id:<18} {', '.join(spec.hf_repo_ids)}")
        for scheme in pm.collect("ninfer_quant_schemes"):
            print(f"quant       {scheme.name:<18} {scheme.bits_per_weight:g} bits/weight")
        for s in pm.collect("ninfer_speculators"):
            print(f"speculator  {getattr(s, 'name', s)}")
        c = pm.choose("ninfer_sampler", device, slot="sampler")
        print(f"sampler     {c.name}  [{c.plugin}]")
        return 0
    config = EngineConfig(
        model=_resolve_model(args.model),
        weights=args.weights,
        quant=args.quant,
        spec=args.spec,
        device=args.device,
        max_context=4096 if args.max_context is None else args.max_context,
        kv_dtype=args.kv_dtype,
    )
    p = plan(config, plugins=pm, need_weights=False, strict=False)
    print(p.report(pm))
    return 2 if p.problems else 0


def cmd_make_tiny(args: argparse.Namespace) -> int:
    from ninfer.testing import make_tiny

    from ninfer.outputs import new_folder_problem

    target = Path(args.out)
    if (why := new_folder_problem(target, "--out", "make-tiny")) is not None:
        raise UserError(why, param="out")
    out = make_tiny(args.like, target, seed=args.seed, vocab=args.vocab, expert_layout=args.expert_layout)
    print(out)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from ninfer.server.app import serve

    config = engine_config(args, max_batch=args.max_batch, default_context=8192)
    return serve(
        config,
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        model_id=args.model_id,
        default_thinking=not args.no_thinking,
    ) or 0


def bench_config(args: argparse.Namespace) -> tuple[Any, Any]:
    """(EngineConfig, BenchOptions) of a parsed `ninfer bench` command line."""
    from ninfer import bench

    opts = bench.BenchOptions(
        prompt_len=args.prompt_len,
        gen_len=args.gen_len,
        context_len=args.context_len,
        concurrency=args.concurrency,
        compare_transformers=args.compare_transformers,
        compare_gen_len=args.compare_gen_len,
    )
    opts.check()
    context = args.context_len or args.prompt_len
    # the cache's smallest size (config.MIN_CONTEXT) where prompt + generation is shorter
    from ninfer.config import MIN_CONTEXT

    config = engine_config(args, max_batch=args.concurrency, default_context=max(context + args.gen_len, MIN_CONTEXT))
    return config, opts


def cmd_bench(args: argparse.Namespace) -> int:
    from ninfer import bench

    from ninfer.outputs import check_output_file

    check_output_file(args.json_out, "--json")
    config, opts = bench_config(args)
    result = bench.run(config, opts)
    print(bench.table(result))
    if args.json_out:
        bench.write_json(result, args.json_out)
    return 0


def cmd_not_yet(args: argparse.Namespace) -> int:
    raise UserError(f"`ninfer {args.command}` is not built yet in this version.")


def cmd_convert(args: argparse.Namespace) -> int:
    """Pack a checkpoint once (`ninfer_convert`); `--model OUT` then loads it by copying bytes."""
    from ninfer.checkpoint import locate
    from ninfer.plugins import get_plugin_manager

    pm = get_plugin_manager()
    found = locate(_resolve_model(args.model), args.weights, plugins=pm)
    if args.shortlist is not None:
        drafter = next((s for s in pm.collect("ninfer_speculators") if hasattr(s, "convert_shortlist")), None)
        if drafter is None:
            raise UserError("--shortlist needs a speculator plugin that builds shortlists (spec_mtp).")
        print(drafter.convert_shortlist(str(found.path), args.out or str(found.path), args.shortlist, args.corpus))
        return 0
    if args.quant is None or args.out is None:
        raise UserError("ninfer convert needs --quant and --out (or --shortlist N).")
    # the plugin refuses a non-empty --out before it reads any weight
    written = pm.hook.ninfer_convert(
        path=str(found.path), shape=found.shape, spec=found.spec, quant=args.quant, out=str(Path(args.out).expanduser())
    )
    if written is None:
        raise UserError(f"{found.path}: no installed plugin converts a {getattr(found.shape, 'family', '?')} checkpoint.")
    print(written)
    return 0


HANDLERS = {
    "run": cmd_run,
    "serve": cmd_serve,
    "bench": cmd_bench,
    "convert": cmd_convert,
    "plugins": cmd_plugins,
    "make-tiny": cmd_make_tiny,
}


def main(argv: list[str] | None = None) -> int:
    from ninfer import logs

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0] not in COMMANDS and argv[0] not in ("-h", "--help")):
        argv.insert(0, "run")
    parser = build_parser()
    args = parser.parse_args(argv)
    logs.configure(getattr(args, "log_level", "warning"))
    try:
        return HANDLERS[args.command](args)
    except UserError as exc:
        sys.stdout.flush()
        print(f"ninfer: error: {exc.message}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("ninfer: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
