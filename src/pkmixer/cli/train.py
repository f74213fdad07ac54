"""The training verbs: train, finetune, convert, throughput, eval."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import ConfigError, check_input_file
from ..overrides import parse_overrides
from .common import MAX_BATCH, bounded, checkpoint_path, fresh_output, print_table


def cmd_train(args: argparse.Namespace) -> int:
    """Train a registered model (App. C recipes); a run directory keeps config, metrics and checkpoints."""
    from ..train.config import MAX_EPOCHS, build_config, load_yaml
    from ..train.engine import TrainingDiverged
    from ..train.loop import train
    from ..train.run import default_run_dir
    from ..train.preflight import preflight

    overrides = parse_overrides(args.set)
    if args.data_dir is not None:
        overrides["data.data_dir"] = args.data_dir
    bounded("--stop-after", args.stop_after, 1, MAX_EPOCHS)
    if args.resume:
        if args.run_dir is None:
            raise ConfigError("--resume needs --run-dir DIR")
        cfg = None if args.config is None and not overrides else \
            build_config(None if args.config is None else load_yaml(args.config), overrides)
    else:
        cfg = build_config(None if args.config is None else load_yaml(args.config), overrides)
    run_dir = args.run_dir or default_run_dir(cfg.model.name, cfg.data.name)
    if not args.resume:
        preflight(cfg, run_dir)
    try:
        import torch

        summary = train(cfg, run_dir, resume=args.resume, stop_after=args.stop_after,
                        threads=torch.get_num_threads() if args.threads_chosen else None)
    except TrainingDiverged as err:
        sys.stderr.write(f"pkmixer train: {err}\n")
        return 1
    if args.json:
        print(json.dumps({"run_dir": str(run_dir), **summary}, indent=2))
    else:
        state = "" if summary["status"] == "finished" else \
            f" - stopped after epoch {summary['epochs_done']} of {summary['epochs']}; continue with --resume"
        chosen = (f"validation-selected epoch {summary['selected_epoch']}: val error {summary['best_val_error']:.2%}, "
                  f"test error {summary['selected_test_error']:.2%}; " if summary["selection"] == "val_error" else "")
        print(f"{run_dir}: {chosen}last epoch: test error {summary['final_test_error']:.2%} "
              f"({summary['wall_time']:.0f} s){state}")
    return 0


def cmd_finetune(args: argparse.Namespace) -> int:
    """Fine-tune a checkpoint at a higher resolution: token-mixing MLPs enlarged block-diagonally (supp. C)."""
    from ..models.convert import import_checkpoint

    if args.image_size <= 0:
        raise ConfigError(f"--image-size must be a positive integer, got {args.image_size}")
    taken = [item for item in args.set if item.split("=", 1)[0].strip() in ("model.name", "model.init", "model.img_size")]
    if taken:
        raise ConfigError(f"finetune sets model.name, model.init and model.img_size itself; drop --set {taken[0]}")
    source = checkpoint_path(args.checkpoint)
    name = import_checkpoint(source).model.spec.name
    args.set = [*args.set, f"model.name={name}", f"model.init={source}", f"model.img_size={args.image_size}"]
    args.resume, args.stop_after = False, None
    return cmd_train(args)


def cmd_eval(args: argparse.Namespace) -> int:
    """Top-1 error and loss on the test split: of a run's checkpoint, or of a checkpoint file (pkmixer ``.pt``,
    timm ``.pth`` or Flax ``.npz``) on the data set given with --set data.name=..."""
    from ..train.evaluation import evaluate_checkpoint, evaluate_run

    overrides = parse_overrides(args.set)
    if args.data_dir is not None:
        overrides["data.data_dir"] = args.data_dir
    from ..train.config import build_config
    from ..train.preflight import model_options

    target = Path(args.target)
    if not target.exists():
        raise ConfigError(f"no run directory or checkpoint file at {target}")
    taken = [k for k in overrides if k in ("model.name", "model.init")]
    if taken:
        raise ConfigError(f"eval takes the model from the checkpoint; drop --set {taken[0]}")
    if overrides:
        cfg = build_config(None, overrides)  # every value checked against its domain
        model_options(cfg.model, cfg.data)  # a head with fewer classes than the data set's is refused
        if cfg.data.data_dir is not None and not Path(cfg.data.data_dir).is_dir():  # --data-dir or --set
            raise ConfigError(f"data.data_dir {cfg.data.data_dir} is not a folder")
    if target.is_file():
        result = evaluate_checkpoint(target, overrides)
        where = f"{result['checkpoint']} on {result['data']}"
    else:
        if overrides:
            raise ConfigError("a run directory is evaluated with its own config: drop --set and --data-dir")
        result = evaluate_run(target, args.checkpoint)
        where = f"{result['run']} ({result['checkpoint']}, epoch {result['epoch']}, selected by {result['selection']})"
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{where}: test error {result['test_error']:.2%}, test loss {result['test_loss']:.4f} "
              f"on {result['test_examples']} examples")
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    """Convert MLP-Mixer weights between Google's Flax ``.npz`` (Listing 1 names), timm ``.pth`` and pkmixer
    ``.pt`` checkpoints, by the destination's suffix; --num-classes gives a new zero head (Mixer supp. C).
    A Flax ``.npz`` imports with Listing 1's tanh GELU, a timm ``.pth`` with the exact GELU (--act to choose);
    writing a model to a format whose code computes the other GELU warns, one line on stderr."""
    import warnings

    from ..models.convert import ActivationWarning, convert_checkpoint

    fresh_output(args.dst, args.overwrite, "destination")
    check_input_file(args.src, "source checkpoint")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ActivationWarning)
        result = convert_checkpoint(args.src, args.dst, model=args.model, num_classes=args.num_classes,
                                    img_size=args.img_size, overwrite=args.overwrite, act=args.act)
    for w in caught:
        if issubclass(w.category, ActivationWarning):
            sys.stderr.write(f"pkmixer convert: warning: {w.message}\n")
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        head = ", new head" if result["head_replaced"] else ""
        print(f"{result['source']} ({result['source_format']}) -> {result['destination']} "
              f"({result['destination_format']}): {result['model']}, {result['params'] / 1e6:.2f}M parameters, "
              f"{result['num_classes']} classes at {result['img_size']} px, {result['dtype']}, "
              f"act {result['act']}{head}")
    return 0


def cmd_throughput(args: argparse.Namespace) -> int:
    """Inference images/s on this device beside supp. Table 2's published throughput and pre-training
    exaFLOPs, and the exaFLOPs computed as 3 × 2 × MACs × 300M images × epochs."""
    from ..analysis.throughput import throughput_table

    names = None if args.models is None else [n for n in args.models.split(",") if n]
    bounded("--batch-size", args.batch_size, 1, MAX_BATCH)
    bounded("--warmup", args.warmup, 0, 10_000)
    bounded("--repeats", args.repeats, 1, 10_000)
    bounded("--image-size", args.image_size, 1, 8192)
    rows = throughput_table(names, args.batch_size, args.dtype, args.device, args.warmup, args.repeats,
                            args.image_size, quick=args.quick)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0

    def num(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    print(f"{rows[0]['device_name']}, {rows[0]['dtype']}, batch {rows[0]['batch_size']}, "
          f"median of {rows[0]['repeats']} forwards after {rows[0]['warmup']} warm-up")
    print_table([[r["title"] or r["name"], f"{r['params'] / 1e6:.1f}M", f"{r['gmacs']:.2f}", r["image_size"],
                  f"{r['images_per_s']:.1f}", num(r["published_tpuv3_images_per_s_per_core"], ".0f"),
                  num(r["published_v100_images_per_s_per_core"], ".0f"), num(r["pretrain_epochs"], "d"),
                  num(r["exaflops"], ".0f"), num(r["published_exaflops"], ".0f")] for r in rows],
                ["model", "params", "GMACs", "px", "img/s here", "TPUv3 img/s/core", "V100 img/s/core",
                 "epochs", "exaFLOPs", "published"])
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """The sub-commands of this group, in the order `pkmixer --help` lists them."""
    p = sub.add_parser("train", help="train a model; resumable run directories", description=cmd_train.__doc__)
    p.add_argument("config", nargs="?", help="a YAML preset (configs/*.yaml); defaults otherwise")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a setting, e.g. --set optim.lr=0.1 --set model.depth=4 --set data.name=digits")
    p.add_argument("--data-dir", help="where the data set lies (the same as --set data.data_dir=DIR)")
    p.add_argument("--run-dir", help="the run directory (default runs/<model>-<data>-<time>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --run-dir from its latest checkpoint")
    p.add_argument("--stop-after", type=int, metavar="N", help="stop after N epochs in this invocation (resumable)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("finetune", help="fine-tune a checkpoint at a higher resolution (Mixer supp. C)",
                       description=cmd_finetune.__doc__)
    p.add_argument("checkpoint", help="a checkpoint file or a run directory (its best checkpoint)")
    p.add_argument("--image-size", type=int, required=True, help="the new image side: an integer multiple of the old")
    p.add_argument("config", nargs="?", help="a YAML preset (e.g. configs/supp/finetune_cifar10.yaml)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a setting")
    p.add_argument("--data-dir", help="where the data set lies")
    p.add_argument("--run-dir", help="the run directory (default runs/<model>-<data>-<time>)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_finetune)

    p = sub.add_parser("convert", help="convert Mixer weights: Flax .npz, timm .pth, pkmixer .pt",
                       description=cmd_convert.__doc__)
    p.add_argument("src", help="a Flax .npz (e.g. Google's imagenet21k/Mixer-B_16.npz), timm .pth or pkmixer .pt")
    p.add_argument("dst", help="the file to write; its suffix picks the format: .npz, .pth or .pt")
    p.add_argument("--model", help="the registered model the weights must fit (default: inferred from the shapes)")
    p.add_argument("--num-classes", type=int, help="a new zero head with this many classes")
    p.add_argument("--img-size", type=int, help="the image side (default: the checkpoint's, from its token count)")
    p.add_argument("--act", choices=["gelu", "gelu_tanh"],
                   help="the GELU of the model (default: gelu_tanh for a Flax .npz, as Listing 1's nn.gelu; gelu, the "
                        "exact one, for a timm .pth; a pkmixer .pt's own)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing destination")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_convert)

    p = sub.add_parser("throughput", help="images/s here beside supp. Table 2", description=cmd_throughput.__doc__)
    p.add_argument("--models", help="comma-separated registered models (default: the seven Mixers of Table 2)")
    p.add_argument("--quick", action="store_true", help="Mixer-S/32 and S/16, batch 2: a CPU check in seconds")
    p.add_argument("--batch-size", type=int, help="images per forward (default 64; 2 with --quick)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: CUDA when present)")
    p.add_argument("--warmup", type=int, help="untimed forwards first (default 3; 2 with --quick)")
    p.add_argument("--repeats", type=int, help="timed forwards, median taken (default 10; 2 with --quick)")
    p.add_argument("--image-size", type=int, help="measure at another resolution (a multiple of the patch)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_throughput)

    p = sub.add_parser("eval", help="evaluate a run or a checkpoint file", description=cmd_eval.__doc__)
    p.add_argument("target", help="a run directory written by `pkmixer train`, or a checkpoint file")
    p.add_argument("--checkpoint", choices=["best", "latest"],
                   help="which of a run's checkpoints (default: best.pt, chosen on the validation split, where the "
                        "run has one; else latest.pt)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="for a checkpoint file: the data, e.g. --set data.name=cifar10 --set data.test_subset=1000")
    p.add_argument("--data-dir", help="for a checkpoint file: where the data set lies")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_eval)
