"""A copy of a GGUF model with every quantized weight requantized to another GGUF type (its
float32 and float16 tensors, the norms, kept as they are), for measuring models of that
type (the default model's file is Q4_1 with a Q8_0 embedding):

    python -m bench_agent.requantize_gguf --type Q8_0 --out /tmp/SmolLM2-135M-Instruct.Q8_0.gguf
    python -m bench_agent.bench_weight_blocks --model /tmp/SmolLM2-135M-Instruct.Q8_0.gguf

The values are the source's dequantized ones quantized again by gguf's own quantizer, so
the copy is no better than its source: it is for speed and memory, not quality.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# The GGUF file type each target type makes ("general.file_type").
FILE_TYPES = {"Q8_0": "MOSTLY_Q8_0", "Q4_1": "MOSTLY_Q4_1", "Q4_0": "MOSTLY_Q4_0"}


def requantize(source: Path, out: Path, target: str) -> int:
    """Write ``out``; returns how many tensors were requantized."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(str(source))
    kind = gguf.GGMLQuantizationType[target]
    writer = gguf.GGUFWriter(str(out), reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":  # the writer adds these
            continue
        value = field.contents()
        if name == "general.file_type":
            value = gguf.LlamaFileType[FILE_TYPES[target]].value
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, field.types[0], sub_type)
    kept = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
    changed = 0
    for tensor in reader.tensors:
        if tensor.tensor_type in kept:
            writer.add_tensor(tensor.name, np.asarray(tensor.data), raw_dtype=tensor.tensor_type)
            continue
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        writer.add_tensor(tensor.name, gguf.quants.quantize(values, kind), raw_dtype=kind)
        changed += 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--type", choices=sorted(FILE_TYPES), required=True, help="the GGUF type of the copy's weights")
    ap.add_argument("--out", type=Path, required=True, help="the copy's path (.gguf)")
    ap.add_argument("--source", type=Path, default=None, help="the GGUF file to copy (default: the default model's)")
    ns = ap.parse_args(argv)
    from runtime.model_loader.default_model import find_default_gguf

    source = ns.source or find_default_gguf()
    if ns.out.suffix != ".gguf":
        ap.error("--out must end in .gguf (the loader tells GGUF files by their suffix)")
    changed = requantize(source, ns.out, ns.type)
    print(f"{ns.out}: {changed} tensors of {source.name} as {ns.type}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
