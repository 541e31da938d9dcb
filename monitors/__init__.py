"""Everything that observes a run, without UI (``stepwatch.monitors``). The folder says the layer:

- ``readers/``: the run dir's files read incrementally (events.jsonl, train.log, change notice, rank prefixes);
- ``parsers/``: what a training program prints (HF/tqdm progress, dynamo records, tracebacks);
- ``stats/``: step-time statistics (the one nearest-rank);
- ``detectors/``: pure detectors, each owning its constants (fallback and its baseline, stall, storm);
- ``fold/``: events.jsonl folded into state, and the supervisor's saved fold;
- ``snapshot/``: the observer that builds the status snapshot, its model, alerts, acknowledgements;
- ``gpu/``: NVML sampler, backends, readings, history;
- ``telemetry/``: the emitter, published as ``stepwatch.telemetry`` (runs inside the training process);
- ``watch/``: the supervisor's monitoring (log steps timed at arrival, the detector loop, alert delivery);
- ``export/``: the snapshot in Prometheus' text format;
- beside them: ``protocol`` (events.jsonl kinds, keys, flags), ``runfiles``, ``rundirs``, ``watchdog``, ``oomkills`` (the kernel's OOM kills).

What each owns, and what must never be done a second time elsewhere: ARCHITECTURE.md, "Folders".

Keep this module free of imports: stepwatch.telemetry imports ``stepwatch.monitors.protocol`` inside
the training process, which must load only the standard library.
"""
