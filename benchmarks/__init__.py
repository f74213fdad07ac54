"""pkmixer's benchmark suite (docs/performance.md): ours against timm and dense baselines.

``python -m benchmarks.run`` (``make bench``, ``make bench-full``) runs the sections

* a - MLP-Mixer / S-Mixer training step and inference throughput against timm's MlpMixer, eager and compiled;
* b - RP-Mixer step time against the normal Mixer of the same shape;
* c - SW-MLP: sparse (CSR) against dense-masked weights, step time and peak memory, and the largest Ω;
* d - Kronecker and Monarch layers against a dense layer of the same width;
* e - token-mixing formulations;
* f - achieved FLOP/s of every model of (a) as a fraction of a plain sgemm measured in the same run;
* g - ``pkmixer train``'s epoch against a frozen hand-written in-memory loop;
* h - Fig. 5 at paper scale on a GPU: each model's step per precision and the sweep's projected GPU hours;
* n - narrow Mixers against square ones per FLOP on the fig5/6 grid, and a small S-Mixer against its own matrix
  products;
* s - stacked training (K runs as one model) against K sequential runs,

and writes one JSON file and one Markdown file per run. Method (:mod:`benchmarks.common`): every figure is the
median of several timed repeats after warm-up, and the cases compared with each other are timed round-robin
in one loop, so that load from other processes falls on all of them alike; every comparison is a ratio of
medians from the same loop, or (section n) the median of the ratios round by round. Peak memory is measured in a
fresh subprocess per case (:mod:`benchmarks.memprobe`). ``python -m benchmarks.kernel_counts`` counts the
instructions the fused sublayers' kernel runs per vector under valgrind (no timing; not a section).
"""
