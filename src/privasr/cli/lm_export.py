"""``privasr lm export``: a neural LM checkpoint as an ONNX or TorchScript model for devices, optionally int8.

:func:`register` adds the command to the ``privasr lm`` typer app; the work is
:func:`privasr.lm.neural.export.export_checkpoint` (the folder layout and the graph are described there).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from privasr.cli._console import make_console
from privasr.errors import InputError

__all__ = ["register"]

out_console = make_console()
err_console = make_console(stderr=True)


def register(app: typer.Typer) -> None:
    """Add ``export`` to ``app`` (the ``privasr lm`` group)."""

    @app.command("export")
    def export(
        checkpoint: Annotated[Path, typer.Argument(help="Neural LM checkpoint (privasr lm train-neural, or a "
                                                   "config's cached NAME.pt).")],
        out: Annotated[Path, typer.Option("--out", help="Output folder: model.onnx or model.pt, vocab.json, "
                                          "meta.json.")],
        to: Annotated[str, typer.Option("--to", help="onnx (onnxruntime; the onnx extra) or torchscript.")]
        = "onnx",
        int8: Annotated[bool, typer.Option("--int8", help="Dynamic int8 quantisation of the weights (linear and "
                                           "LSTM layers, output layer, embeddings).")] = False,
        embeddings: Annotated[bool, typer.Option("--int8-embeddings/--fp32-embeddings", help="With --int8: "
                                                 "quantise the embedding tables too.")] = True,
        per_channel: Annotated[bool | None, typer.Option(
            "--per-channel/--per-tensor", help="With --int8: one scale per output channel of each weight (the "
            "default) or one per tensor.", show_default=False)] = None,
        json_out: Annotated[bool, typer.Option("--json", help="Print meta.json.")] = False,
    ) -> None:
        """Export a neural LM checkpoint for on-device scoring (ONNX or TorchScript, fp32 or int8)."""
        from privasr.outputs import check_output_dir, output_dir

        if to not in ("onnx", "torchscript"):
            raise InputError(f"--to {to!r}", expected="onnx or torchscript")
        if per_channel is not None and not int8:
            raise InputError(f"--{'per-channel' if per_channel else 'per-tensor'} without --int8",
                             expected="--per-channel or --per-tensor only with --int8")
        check_output_dir(out)
        if to == "onnx":
            try:
                import onnx  # noqa: F401
                import onnxruntime  # noqa: F401
            except ImportError:
                raise InputError("exporting to ONNX needs onnx and onnxruntime",
                                 expected="pip install privasr[onnx]") from None
        from privasr.lm.neural.checkpoint import load_checkpoint
        from privasr.lm.neural.export import export_checkpoint

        load_checkpoint(checkpoint)  # bad input fails here, before the output folder is made
        with output_dir(out):
            info = export_checkpoint(checkpoint, out, to=to, int8=int8, quantize_embeddings=embeddings,
                                     per_channel=True if per_channel is None else per_channel)
        if json_out:
            out_console.print_json(json.dumps(info.meta))
        err_console.print(f"{info.meta['arch']} ({info.meta['softmax']} softmax) -> {out / info.meta['model_file']}: "
                          f"{info.model_bytes:,} bytes, {'int8' if int8 else 'fp32'} {to}", highlight=False)
