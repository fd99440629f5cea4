"""``sandbox plan BUNDLE``: print the GPU mount plan (a table, or JSON with --json)."""

from __future__ import annotations

import sys

import msgspec

from mounts.actions import LdCache
from sandbox.api import plan_bundle


def main(args) -> int:
    plan = plan_bundle(args.bundle, args.driver_root, args.gpus, args.capabilities, args.max_capabilities,
                       dev_root=args.dev_root, cdi_dirs=tuple(args.cdi_spec_dir))
    out = sys.stdout
    if args.debug:  # what discovery passed over: wrappers, links leading nowhere ...
        for note in plan.notes:
            sys.stderr.write(f"sandbox plan: debug: {note}\n")
    if args.json:
        out.write(msgspec.json.encode(plan).decode() + "\n")
        return 0
    if not plan.actions:
        out.write("no GPU requested: empty plan\n")
        return 0
    d = plan.driver
    found = d.get("libraries_from")
    out.write(f"driver {d['version']} (CUDA {d['cuda']}) at {d['root']}; "
              + (f"libraries by {found} (no ld.so.cache entry); " if found and found != "etc/ld.so.cache" else "")
              + f"GPUs: {', '.join(f'{g.index}:{g.busid}' for g in plan.gpus) or 'none'}"
              + "".join(f"; MIG: {', '.join(f'gpu{m.minor}/gi{m.gi}/ci{m.ci}' for m in plan.migs)}" for _ in plan.migs[:1])
              + "\n")
    rows = [(a.kind, a.target, a.source if not isinstance(a, LdCache) else f"{len(a.entries)} entries",
             ",".join(a.flags)) for a in plan.actions]
    widths = [max(len(r[i]) for r in rows + [("KIND", "TARGET", "SOURCE", "FLAGS")]) for i in range(3)]
    for r in [("KIND", "TARGET", "SOURCE", "FLAGS")] + rows:
        out.write(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}\n")
    return 0
