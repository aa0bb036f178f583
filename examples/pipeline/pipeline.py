"""The example pipeline's steps (flow.yaml): prepare, simulate (one array element), collect, report.

Standard library only; each step reads what the one before wrote under OUT and writes its own.
"""

import json
import os
import random
import sys


def prepare(out: str, sims: str, samples: str) -> None:
    os.makedirs(os.path.join(out, "sims"), exist_ok=True)
    with open(os.path.join(out, "params.json"), "w") as f:
        json.dump({"sims": int(sims), "samples": int(samples)}, f)
    print(f"prepared {sims} simulations of {samples} samples in {out}")


def simulate(out: str) -> None:
    index = int(os.environ["XCE_ARRAY_INDEX"])
    with open(os.path.join(out, "params.json")) as f:
        samples = json.load(f)["samples"]
    rng = random.Random(index)
    inside = sum(1 for _ in range(samples) if rng.random() ** 2 + rng.random() ** 2 <= 1.0)
    result = {"index": index, "attempt": int(os.environ.get("XCE_ATTEMPT", "1")), "pi": 4.0 * inside / samples}
    with open(os.path.join(out, "sims", f"{index}.json"), "w") as f:
        json.dump(result, f)
    print(f"simulation {index}: pi ~ {result['pi']:.5f}")


def collect(out: str) -> None:
    with open(os.path.join(out, "params.json")) as f:
        sims = json.load(f)["sims"]
    values = []
    for index in range(1, sims + 1):
        with open(os.path.join(out, "sims", f"{index}.json")) as f:
            values.append(json.load(f)["pi"])
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump({"sims": len(values), "pi": sum(values) / len(values), "min": min(values), "max": max(values)}, f)
    print(f"collected {len(values)} simulations")


def report(out: str) -> None:
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    text = (f"pi ~ {summary['pi']:.5f} from {summary['sims']} simulations "
            f"(each between {summary['min']:.5f} and {summary['max']:.5f})\n")
    with open(os.path.join(out, "report.txt"), "w") as f:
        f.write(text)
    print(text, end="")


if __name__ == "__main__":
    step, *args = sys.argv[1:]
    {"prepare": prepare, "simulate": simulate, "collect": collect, "report": report}[step](*args)
