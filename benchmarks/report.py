"""The Markdown tables and the target checks of a benchmark run, from its JSON (see :mod:`benchmarks.run`)."""
from __future__ import annotations

import math


def _ms(t: dict | None) -> str:
    return "-" if t is None else f"{t['median_s'] * 1e3:.1f}"


def _x_quartiles(row: dict, key: str) -> str:
    """A paired ratio with its quartiles over the rounds, where the record has them."""
    q = row.get(f"{key}_quartiles")
    return _x(row[key]) + (f" [{_x(q[0])}, {_x(q[1])}]" if q else "")


def _x(v: float | None) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2f}×"


def _mib(b: float | None) -> str:
    return "-" if b is None else f"{b / 2**20:,.1f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def targets(result: dict) -> list[dict]:
    """Each target with its measured value (None when its section did not run)."""
    s, out = result["sections"], []
    if "a" in s:
        for row in (r for r in s["a"]["rows"] if r["kind"] == "train"):
            out.append({"target": f"{row['model']} training step vs timm eager", "goal": "≥ 1.20×",
                        "value": row["speedup_eager"], "met": row["speedup_eager"] >= 1.2})
            if "speedup_compiled" in row:
                out.append({"target": f"{row['model']} compiled training step vs timm compiled", "goal": "≥ 1.00×",
                            "value": row["speedup_compiled"], "met": row["speedup_compiled"] >= 1.0})
                out.append({"target": f"{row['model']} ours compiled vs timm eager", "goal": "≥ 1.20×",
                            "value": row["ours_compiled_vs_timm_eager"],
                            "met": row["ours_compiled_vs_timm_eager"] >= 1.2})
    if "f" in s:
        for row in (r for r in s["f"]["rows"] if r["model"] == "mixer_b16_224" and r["impl"] == "ours"):
            out.append({"target": "Mixer-B/16 training FLOP/s as a fraction of same-loop sgemm", "goal": "≥ 0.65",
                        "value": row["fraction_of_sgemm"], "met": row["fraction_of_sgemm"] >= 0.65})
    if "b" in s:
        for row in (r for r in s["b"]["rows"] if "rp_overhead" in r):
            out.append({"target": f"RP overhead, {row['model']}", "goal": "≤ 2 %", "value": row["rp_overhead"],
                        "met": row["rp_overhead"] <= 0.02})
    if "c" in s:
        for row in (r for r in s["c"]["rows"] if "speedup" in r and r["density"] <= 1 / 64 and r["width"] >= 4096):
            case = f"m={row['width']}, p=1/{round(1 / row['density'])}"
            out.append({"target": f"SW-MLP sparse vs dense-masked step, {case}", "goal": "> 1×",
                        "value": row["speedup"], "met": row["speedup"] > 1.0})
        s3 = s["c"]["table_s3"]
        out.append({"target": "SW-MLP sparse / RP-Mixer peak training memory, same Ω (Table S.3, CIFAR; "
                              "paper's dense SW-MLP: 817×)", "goal": "≤ 3×",
                    "value": s3["sparse_peak_over_rp_peak"], "met": s3["sparse_peak_over_rp_peak"] <= 3})
        out.append({"target": "SW-MLP sparse peak training memory / RP-Mixer parameter memory, same Ω "
                              "(Table S.3, CIFAR)", "goal": "≤ 3×", "value": s3["sparse_peak_over_rp_param_bytes"],
                    "met": s3["sparse_peak_over_rp_param_bytes"] <= 3})
    if "g" in s:
        for row in (r for r in s["g"]["rows"] if r["goal"] is not None):
            out.append({"target": f"pkmixer train epoch / in-memory reference loop, {row['case']}",
                        "goal": f"≤ {row['goal']}", "value": row["ratio"], "met": row["ratio"] <= row["goal"]})
    if "h" in s:
        by: dict = {}
        for r in s["h"]["projection"]:
            by.setdefault(r["precision"], {}).setdefault(r["omega"] <= 2**21, 0.0)
            by[r["precision"]][r["omega"] <= 2**21] += r["gpu_hours"]
        for precision, parts in by.items():
            out.append({"target": f"Fig. 5 Ω ≤ 2^21 runs, GPU-minutes in all ({precision})", "goal": "≤ 30 min",
                        "value": 60 * parts.get(True, 0.0), "met": 60 * parts.get(True, 0.0) <= 30})
        for r in (r for r in s["h"]["rows"] if r["omega"] == 2**27):
            out.append({"target": f"Ω = 2^27 {r['model']} {_shape(r['options'])} ({_precision(r)}), fraction of "
                                  "matmul throughput", "goal": "≥ 0.60", "value": r["fraction_of_matmul"],
                        "met": r["fraction_of_matmul"] >= 0.6})
    if "w" in s:
        for r in s["w"]["rows"]:
            out.append({"target": f"Fig. 5 Ω ≤ 2^21 runs as a whole sweep, GPU-minutes in all ({r['case']})",
                        "goal": "≤ 30 min", "value": r["projected_gpu_minutes"], "met": r["projected_gpu_minutes"] <= 30})
    if "n" in s:
        for r in (r for r in s["n"]["rows"] if r["C"] != r["S"]):
            out.append({"target": f"{r['family']} (C, S) = ({r['C']}, {r['S']}) step time per FLOP / the square "
                                  "model's", "goal": "≤ 1.30×", "value": r["per_flop_vs_square"],
                        "met": r["per_flop_vs_square"] <= 1.3})
        own = s["n"]["own_products"]
        out.append({"target": f"{own['model']} training step / its own matrix products alone", "goal": "≤ 1.50×",
                    "value": own["step_over_products"], "met": own["step_over_products"] <= 1.5})
    if "s" in s and result["settings"]["device"] == "cuda":  # reported on the CPU, a target on a GPU
        for r in (r for r in s["s"]["rows"] if r["model"] == "smixer_c64p4_32" and r["members"] == 8):
            out.append({"target": "Ω = 2^18 S-Mixer stacked ×8 / 8 sequential runs, member-steps per second",
                        "goal": "≥ 3×", "value": r["speedup"], "met": r["speedup"] >= 3})
    return out


def _precision(row: dict) -> str:
    """A section-h row's precision, and its torch.compile mode when compiled."""
    mode = row.get("compile_mode")
    return row["precision"] + (f", compiled ({mode})" if mode else "")


def _shape(options: dict) -> str:
    if "width" in options:
        return f"m = {options['width']}, p = {options['density']:g}"
    return f"C = {options['embed_dim']}, S = {options['num_tokens']}"


def markdown(result: dict) -> str:
    m, st = result["machine"], result["settings"]
    lines = [f"# pkmixer benchmarks ({st['mode']} mode)", "",
             f"{m['cpu_model']}, {m['cpu_cores']} cores, torch {m['torch']} ({m['torch_threads']} threads), "
             f"timm {m['timm']}, device {m['device_name']}, dtype {st['dtype']}; "
             f"{st['warmup']} warm-up + {st['repeats']} timed repeats per case, medians; load average at start "
             f"{m['load_average'][0]:.2f}, at end {result['load_average_end'][0]:.2f}. Started {result['started']}, "
             f"{result['elapsed_s']:.0f} s.", ""]
    s = result["sections"]
    if "a" in s:
        lines += ["## (a) Mixers against timm's MlpMixer", "",
                  "Training step (fused AdamW) in ms; speedup = timm / ours.", ""]
        rows = []
        for r in (r for r in s["a"]["rows"] if r["kind"] == "train"):
            t = r["times"]
            rows.append([r["model"], str(r["batch"]), _ms(t["ours"]), _ms(t["timm"]), _x(r["speedup_eager"]),
                         _ms(t.get("ours_compiled")), _ms(t.get("timm_compiled")), _x(r.get("speedup_compiled")),
                         _x(r.get("ours_compiled_vs_timm_eager"))])
        lines += _table(["model", "batch", "ours eager", "timm eager", "speedup eager", "ours compiled",
                         "timm compiled", "speedup compiled", "ours compiled / timm eager"], rows)
        lines += ["", "Inference (eval, inference_mode), images/s; speedup = timm time / ours.", ""]
        rows = []
        for r in (r for r in s["a"]["rows"] if r["kind"] == "infer"):
            ips = r["images_per_s"]
            rows.append([r["model"], str(r["batch"]), f"{ips['ours']:.1f}", f"{ips['timm']:.1f}",
                         _x(r["speedup_eager"]),
                         f"{ips['ours_compiled']:.1f}" if "ours_compiled" in ips else "-",
                         f"{ips['timm_compiled']:.1f}" if "timm_compiled" in ips else "-",
                         _x(r.get("speedup_compiled"))])
        lines += _table(["model", "batch", "ours eager", "timm eager", "speedup eager", "ours compiled",
                         "timm compiled", "speedup compiled"], rows)
        lines.append("")
    if "b" in s:
        lines += ["## (b) RP-Mixer against the normal Mixer", "", "Training step in ms.", ""]
        rows = []
        for r in s["b"]["rows"]:
            t = r["times"]
            if "rp_overhead" in r:
                rows.append([r["model"], str(r["batch"]), _ms(t["normal"]), _ms(t["rp"]),
                             f"{100 * r['rp_overhead']:+.1f} %"])
        lines += _table(["model", "batch", "normal", "RP", "RP overhead"], rows)
        lines += ["", "The permutation gather alone (forward + backward), ms:", ""]
        rows = [[r["model"], _ms(r["times"]["index_select"]), _ms(r["times"]["permute_columns"]), _x(r["speedup"])]
                for r in s["b"]["rows"] if "speedup" in r]
        lines += _table(["case", "index_select autograd", "PermuteColumns", "speedup"], rows)
        lines.append("")
    if "c" in s:
        c = s["c"]
        lines += ["## (c) SW-MLP: sparse (CSR) against dense-masked", "",
                  f"{c['rows'][0]['depth']} single-layer blocks of width m, batch {c['rows'][0]['batch']}, AdamW; "
                  "step in ms, peak memory in MiB over the pre-build resident set (one subprocess per case).", ""]
        rows = []
        for r in c["rows"]:
            mem, t = r["memory"], r["times"]
            rows.append([str(r["width"]), f"1/{round(1 / r['density'])}", f"{r['omega']:,.0f}",
                         _ms(t["sparse"]), _ms(t.get("masked")), _x(r.get("speedup")),
                         _mib(mem["sparse"].get("peak_bytes")), _mib(mem.get("masked", {}).get("peak_bytes")),
                         _x(r.get("memory_ratio"))])
        lines += _table(["m", "p", "Ω per layer", "sparse step", "masked step", "speedup", "sparse MiB",
                         "masked MiB", "memory ratio"], rows)
        lo = c["largest_omega"]
        run = lo["real_run"]
        lines += ["", "Per-weight memory is the slope between the two largest measured cases of each form. "
                  f"Largest Ω per layer on {lo['machine_bytes'] / 2**30:.0f} GiB at "
                  f"p = 1/{round(1 / lo['density'])}, {lo['depth']} layers: sparse "
                  f"{lo['sparse_bytes_per_kept_weight']:.1f} B per kept weight "
                  f"→ Ω ≈ {lo['sparse_max_omega']:.3g}; dense-masked {lo['masked_bytes_per_entry']:.1f} B per m² "
                  f"entry → m ≤ {lo['masked_max_width']}, "
                  f"Ω ≈ {lo['masked_max_omega']:.3g}; "
                  f"ratio {lo['omega_ratio']:.0f}×. Real sparse run: m = {run['width']}, "
                  f"Ω = {run['omega']:,.0f} per layer, batch {run['batch']}: "
                  + (f"peak {_mib(run['peak_bytes'])} MiB, build {run['build_s']:.1f} s, step "
                     f"{1e3 * run['step_s'][-1]:.0f} ms, loss {run['loss']:.3f} (trains: {run['trains']})."
                     if run.get("ok") else f"failed: {run.get('error')}"), ""]
        s3 = c["table_s3"]
        mem, t = s3["memory"], s3["times"]
        lines += [f"Table S.3, CIFAR setting (S = {s3['S']}, C = {s3['C']}, L = {s3['depth']}, "
                  f"γ = {s3['gamma']:g}, Ω = {s3['omega']:,.0f}, SW-MLP m = {s3['width']}, p = {s3['density']:.4f}, "
                  f"batch {s3['batch']}):", ""]
        rows = [[k, f"{mem[k]['params']:,}", _mib(mem[k]["param_bytes"]), _mib(mem[k]["peak_bytes"]), _ms(t[k])]
                for k in ("mixer", "rp_mixer", "swmlp_sparse", "swmlp_masked")]
        lines += _table(["model", "stored parameters", "parameter MiB", "peak training MiB", "step ms"], rows)
        lines += ["", f"SW-MLP peak training memory / RP-Mixer parameter memory: sparse "
                  f"{s3['sparse_peak_over_rp_param_bytes']:.1f}×, dense-masked "
                  f"{s3['masked_peak_over_rp_param_bytes']:.0f}× "
                  f"(paper, dense: 3.22 GB / 3.94 MB = 817×); SW-MLP parameters / RP-Mixer parameters (sparse): "
                  f"{s3['sparse_param_bytes_over_rp_param_bytes']:.1f}×; peak / RP-Mixer peak: sparse "
                  f"{s3['sparse_peak_over_rp_peak']:.2f}×, dense-masked {s3['masked_peak_over_rp_peak']:.1f}×.", ""]
    if "d" in s:
        lines += ["## (d) Kronecker and Monarch against dense", "",
                  "One forward + backward of a batch of 128, ms (speedup over dense).", ""]
        rows = []
        for r in s["d"]["rows"]:
            t, sp = r["times"], r["speedup_vs_dense"]
            rows.append([f"{r['width']} = {r['n1']}×{r['n2']}", _ms(t["dense"]),
                         f"{_ms(t['kronecker'])} ({_x(sp['kronecker'])})",
                         f"{_ms(t['kronecker_matmul'])} ({_x(sp['kronecker_matmul'])})",
                         f"{_ms(t['monarch'])} ({_x(sp['monarch'])})",
                         f"{r['params']['dense']:,} / {r['params']['kronecker']:,} / {r['params']['monarch']:,}"])
        lines += _table(["n", "dense", "Kronecker (bmm)", "Kronecker (matmul broadcast)", "Monarch",
                         "params dense / Kron / Monarch"], rows)
        lines.append("")
    if "e" in s:
        lines += ["## (e) Token-mixing formulations", "",
                  "W₂ φ(W₁ X) + X on (B, S, C); ms, forward + backward / inference forward; speedup over timm's "
                  "transpose + Linear.", ""]
        names = list(s["e"]["rows"][0]["train_times"])
        rows = []
        for r in s["e"]["rows"]:
            rows.append([f"{r['shape']} (B={r['B']})"]
                        + [f"{_ms(r['train_times'][n])} / {_ms(r['infer_times'][n])} "
                           f"({_x(r['train_speedup_vs_timm'][n])} / {_x(r['infer_speedup_vs_timm'][n])})"
                           for n in names])
        lines += _table(["shape"] + names, rows)
        lines.append("")
    if "f" in s:
        lines += ["## (f) Achieved FLOP/s against a same-loop sgemm", "",
                  "Training-step FLOPs (torch.utils.flop_counter, forward + backward) / median step time, against "
                  "2048³ sgemms timed in the same interleaved loop (as many per call as last about one of our "
                  "steps).", ""]
        rows = [[r["model"], r["impl"], str(r["batch"]), f"{r['train_flops'] / 1e9:,.1f}", f"{r['gflops']:.1f}",
                 f"{r['sgemm_gflops']:.1f}", f"{100 * r['fraction_of_sgemm']:.0f} %"] for r in s["f"]["rows"]]
        lines += _table(["model", "impl", "batch", "GFLOP per step", "GFLOP/s", "sgemm GFLOP/s", "fraction"], rows)
        lines.append("")
    if "g" in s:
        lines += ["## (g) pkmixer train against an in-memory reference loop", "",
                  "Epoch time (training, evaluation, writes) of `pkmixer train` and of the frozen reference loop of "
                  "benchmarks/engine.py, run alternately; medians over repeats of the median of epochs 2 onwards; "
                  "ms per training step = epoch time / steps.", ""]
        rows = [[r["case"], r["pipeline"], str(r["steps_per_epoch"]), f"{r['pkmixer_epoch_s']:.2f} s",
                 f"{r['reference_epoch_s']:.2f} s", f"{r['pkmixer_ms_per_step']:.1f}",
                 f"{r['reference_ms_per_step']:.1f}", _x(r["ratio"])] for r in s["g"]["rows"]]
        lines += _table(["case", "pipeline", "steps", "pkmixer epoch", "reference epoch", "pkmixer ms/step",
                         "reference ms/step", "ratio"], rows)
        lines.append("")
    if "h" in s:
        h = s["h"]
        lines += [f"## (h) Fig. 5 at paper scale on {h['device_name']}: projected from measured steps", "",
                  f"Matrix product {h['matmul_n']}³: " + ", ".join(f"{p} {t:.0f} TFLOP/s" for p, t in
                                                                  h["matmul_tflops"].items())
                  + f". Per model: {h['steps']} fused-AdamW steps at batch 128 on device-resident random images "
                  "(no data pipeline: a floor); training FLOP/s = 6 × forward MACs × images/s.", ""]
        rows = [[r["model"], f"2^{r['omega'].bit_length() - 1}", _shape(r["options"]), _precision(r),
                 f"{r['train_images_per_s']:,.0f}", f"{r['eval_images_per_s']:,.0f}", f"{r['train_tflops']:.1f}",
                 f"{100 * r['fraction_of_matmul']:.0f} %", f"{60 * r['projected_gpu_hours']:.1f}"]
                for r in h["rows"]]
        lines += _table(["family", "Ω", "shape", "precision", "train img/s", "eval img/s", "TFLOP/s",
                         "of matmul", "GPU-min for its runs"], rows)
        lines += ["", "Projected GPU hours of the whole sweep (CIFAR-10, 111 runs), per precision and Ω:", ""]
        by = {}
        for r in h["projection"]:
            by.setdefault(r["precision"], {})[r["omega"]] = r["gpu_hours"]
        omegas = sorted({r["omega"] for r in h["projection"]})
        lines += _table(["precision", *(f"Ω = 2^{o.bit_length() - 1}" for o in omegas), "all"],
                        [[p, *(f"{v[o]:.2f}" for o in omegas), f"{sum(v.values()):.2f}"] for p, v in by.items()])
        lines.append("")
    if "n" in s:
        n = s["n"]
        first = n["rows"][0]
        lines += ["## (n) Narrow Mixers against square ones at fixed Ω", "",
                  f"Ω = {first['omega']:,}, batch {first['batch']}, one fused-AdamW training step; a family's models "
                  "timed round-robin in one loop; per FLOP = step / training FLOPs (forward + backward); "
                  "ratio = the median over the loop's rounds of per FLOP / the square model's (same family) in the "
                  "same round, its quartiles in brackets. Steps in ms; beside each, timed in the "
                  "same loop, the same model with torch's nn.Conv2d as its stem (PatchConv's speedup over it), with "
                  "its sublayers run as modules (fused sublayers' speedup over it; 'not fused': a model without "
                  "the fused path, the same model twice), that with torch's nn.LayerNorm for every "
                  "NarrowLayerNorm (NarrowLayerNorm's speedup over it), and with its RP gathers torch's "
                  "operators (the gather kernel's speedup over it; for a model without RP gathers, a control).",
                  ""]
        rows = [[r["family"], f"({r['C']}, {r['S']})", f"{r['train_flops'] / 1e9:.3f}", _ms(r["time"]),
                 f"{r['ns_per_flop']:.3f}", _x_quartiles(r, "per_flop_vs_square"), _ms(r["conv_stem_time"]),
                 _x(r["stem_speedup"]), _ms(r.get("plain_sublayers_time")),
                 _x(r.get("fused_speedup")) if r.get("fused") else "not fused",
                 _ms(r.get("torch_norm_time")), _x(r.get("norm_speedup")), _ms(r.get("torch_gather_time")),
                 _x(r.get("gather_speedup"))]
                for r in n["rows"]]
        lines += _table(["family", "(C, S)", "GFLOP per step", "step", "ns per FLOP", "per FLOP vs square",
                         "step, nn.Conv2d stem", "PatchConv speedup", "step, plain sublayers",
                         "fused sublayers speedup", "step, plain + nn.LayerNorm", "NarrowLayerNorm speedup",
                         "step, torch gathers", "gather kernel speedup"], rows)
        names = list(n["layer_norm"][0]["times"])
        lines += ["", f"LayerNorm over C channels of the ({first['batch']}, S, C) stream, forward + backward, ms "
                  "(time / torch's kernel):", ""]
        lines += _table(["(C, S)", *names], [[f"({r['C']}, {r['S']})", *(
            f"{1e3 * r['times'][k]['median_s']:.3f} ({_x(r['vs_native'][k])})" if k in r["times"] else "-"
            for k in names)]
            for r in n["layer_norm"]])
        own = n["own_products"]
        lines += ["", f"{own['model']} ({own['depth']} blocks, batch {own['batch']}): training step "
                  f"{_ms(own['times']['step'])} ms (sublayers run as modules: "
                  f"{_ms(own['times'].get('plain sublayers'))} ms), its {own['products']} matrix products replayed "
                  f"alone {_ms(own['times']['products'])} ms; step / products "
                  f"{_x_quartiles(own, 'step_over_products')} (round by round; as modules "
                  f"{_x(own.get('plain_over_products'))}). The products followed by the element-wise floor (the "
                  "bytes the fused sublayers read and write, moved by torch's copy and add alone) take "
                  f"{_ms(own['times'].get('products + floor'))} ms, {_x(own.get('floor_over_products'))} the "
                  "products': no fusion of the element-wise work around these products can bring the step below "
                  "that."]
        parts = own.get("step_parts")
        if parts:
            lines += ["", f"Inside the step (medians of {parts['rounds']} steps timed in the same loop, each part "
                      f"around itself): its products {1e3 * parts['products_s']:.1f} ms, the fused kernel's calls "
                      f"{1e3 * parts['kernel_s']:.1f} ms; the rest of the step's median {1e3 * parts['rest_s']:.1f} "
                      "ms (the optimizer, the loss, the stem and head, norms and sums outside the kernel, autograd)."]
        lines.append("")
    if "s" in s:
        lines += ["## (s) Stacked training against sequential runs", "",
                  f"One call = one training step of each of K members (batch {s['s']['rows'][0]['batch']} each): "
                  "sequential, K models in turn; "
                  "stacked, one step of pkmixer.train.stack; vmap, torch.func.vmap over functional_call. ms per "
                  "call, member-steps/s, speedup = sequential / stacked time in the same loop.", ""]
        rows = [[r["case"], str(r["members"]), _ms(r["times"]["sequential"]), _ms(r["times"]["stacked"]),
                 _ms(r["times"].get("vmap")), f"{r['member_steps_per_s']['sequential']:.1f}",
                 f"{r['member_steps_per_s']['stacked']:.1f}", _x(r["speedup"]), _x(r["vmap_speedup"])]
                for r in s["s"]["rows"]]
        lines += _table(["case", "K", "sequential", "stacked", "vmap", "sequential steps/s", "stacked steps/s",
                         "speedup", "vmap speedup"], rows)
        lines.append("")
    if "w" in s:
        lines += ["## (w) Fig. 5's Ω ≤ 2^21 runs as a whole sweep on one GPU", "",
                  "run_sweep over the runs, 1 and then 2 epochs, every run's whole pipeline; projected to "
                  f"{s['w']['paper_epochs']} epochs as cold-cache extra + wall(1) + {s['w']['paper_epochs'] - 1} × "
                  "(wall(2) − wall(1)).",
                  ""]
        rows = [[r["case"], str(r["runs"]), "/".join(map(str, r["stack_sizes"])), str(r["workers"]),
                 f"{r['cold_cache_extra_s']:.0f} s",
                 f"{r['wall_1_epoch_s']:.0f} s",
                 f"{r['wall_2_epochs_s']:.0f} s", f"{r['per_epoch_s']:.1f} s", f"{r['projected_gpu_minutes']:.0f}"]
                for r in s["w"]["rows"]]
        lines += _table(["case", "runs", "runs a job", "jobs at a time", "cold-cache extra", "1 epoch", "2 epochs",
                         "an epoch more", "projected GPU-min"], rows)
        lines.append("")
    lines += ["## Targets", ""]
    rows = [[t["target"], t["goal"], f"{t['value']:.3f}×" if "%" not in t["goal"] else f"{100 * t['value']:+.1f} %",
             "yes" if t["met"] else "no"] for t in result["targets"]]
    for row, t in zip(rows, result["targets"]):
        if t["goal"].startswith("≥ 0."):
            row[2] = f"{100 * t['value']:.0f} %"
        elif t["goal"].endswith("min"):
            row[2] = f"{t['value']:.1f} min"
    lines += _table(["target", "goal", "measured", "met"], rows)
    return "\n".join(lines) + "\n"
