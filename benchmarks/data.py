"""Input pipeline throughput: batched augmentation on resident tensors (pkmixer.data.batch_augment) against the
per-sample pipeline the DataLoader runs (build_transform on each PIL image, torch.stack, timm's Mixup).

``python -m benchmarks.data [--threads 1] [--batch 256] [--device cpu] [--repeats 5] [--json]``

Images are random 32 px RGB bytes (CIFAR's shape; the cost of these operations does not depend on content
except Equalize's and AutoContrast's branches, which the batched version does not take). Each pipeline's figure
is images per second: the batch size over the median time of one batch, the two pipelines of a configuration
timed round-robin in one loop (:func:`benchmarks.common.interleaved`), after one warm-up round. The
per-sample side runs in this process, as ``data.workers: 0`` does; workers divide its time by at most their
number of free cores. Configurations:

* ``crop-flip``: random crop with padding 4 and horizontal flip (App. C.4; configs/cifar10_smixer.yaml);
* ``autoaugment``: crop-flip and torchvision's AutoAugment CIFAR10 policy (App. C.1: Figs. 2, 4, S.7, S.8);
* ``all``: crop-flip, big_vision RandAugment n2 m15, random erasing 0.25, mixup 0.8 / cutmix 1.0, label
  smoothing 0.1 (the Mixer supplementary's stages).
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch
from PIL import Image

from pkmixer.data import build_mixup, build_transform, dataset_info
from pkmixer.data.batch_augment import build_batch_augment

from .common import Settings, interleaved, threads

CONFIGS = {
    "crop-flip": dict(crop_padding=4, hflip=True),
    "autoaugment": dict(crop_padding=4, hflip=True, auto_augment="cifar10"),
    "all": dict(crop_padding=4, hflip=True, rand_augment="bigvision-n2-m15", random_erasing=0.25),
}
MIX = {"crop-flip": None, "autoaugment": None, "all": dict(mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.5, label_smoothing=0.1)}


def cases(config: str, batch: int, settings: Settings) -> dict:
    info = dataset_info("cifar10")
    rng = np.random.default_rng(0)
    stored = rng.integers(0, 256, (batch, 32, 32, 3), dtype=np.uint8)  # as ArrayImages holds CIFAR
    labels = torch.from_numpy(rng.integers(0, 10, batch))
    kw = dict(train=True, img_size=32, in_chans=3, **CONFIGS[config])
    per_image = build_transform(info, **kw)
    mix = MIX[config]
    mixup = build_mixup(mix["mixup_alpha"], mix["cutmix_alpha"], mix["switch_prob"], mix["label_smoothing"], 10) \
        if mix else None
    augment = build_batch_augment(info, **kw, **(mix or {}))
    resident = torch.from_numpy(stored).permute(0, 3, 1, 2).contiguous().to(settings.torch_device)
    resident_labels = labels.to(settings.torch_device)
    step = iter(range(10**9))

    def per_sample() -> None:
        x = torch.stack([per_image(Image.fromarray(a)) for a in stored])
        x, y = x.to(settings.torch_device), labels.to(settings.torch_device)
        if mixup is not None:
            mixup(x, y)

    def batched() -> None:
        augment(resident, resident_labels, seed=0, epoch=0, step=next(step))

    return {"per-sample": per_sample, "batched": batched}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.data", description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.threads < 1 or args.batch < 2 or args.batch % 2 or args.repeats < 1:
        print("error: --threads and --repeats must be positive and --batch even and >= 2", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda asked for, but torch sees no CUDA device here", file=sys.stderr)
        return 2
    settings = Settings(mode="data", device=args.device, dtype="float32", threads=args.threads, warmup=1,
                        repeats=args.repeats, compile=False)
    out = {"threads": args.threads, "batch": args.batch, "device": args.device, "configs": {}}
    with threads(args.threads):
        for config in CONFIGS:
            times = interleaved(cases(config, args.batch, settings), settings)
            row = {name: {"images_per_s": args.batch / t.median_s, "median_s": t.median_s, "q1_s": t.q1_s,
                          "q3_s": t.q3_s} for name, t in times.items()}
            row["speedup"] = times["per-sample"].median_s / times["batched"].median_s
            out["configs"][config] = row
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"{args.device}, {args.threads} thread(s), batch {args.batch}: images/s (median of {args.repeats})")
        for config, row in out["configs"].items():
            print(f"  {config:11s} per-sample {row['per-sample']['images_per_s']:9.0f}   batched "
                  f"{row['batched']['images_per_s']:9.0f}   x{row['speedup']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
