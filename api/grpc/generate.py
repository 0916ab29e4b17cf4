"""Generates `inference_pb2.py` and `inference_pb2_grpc.py` beside `inference.proto` (grpcio-tools, the `test`
extra): `python -m api.grpc.generate`. The generated files are committed; tests/api/grpc checks they are current."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO = "inference.proto"
GENERATED = ("inference_pb2.py", "inference_pb2_grpc.py")


def generate(out: Path) -> None:
    """Writes the generated modules into `out`; `inference_pb2_grpc` imports its messages from this package."""
    from grpc_tools import protoc

    code = protoc.main(["grpc_tools.protoc", f"-I{HERE}", f"--python_out={out}", f"--grpc_python_out={out}",
                        str(HERE / PROTO)])
    if code != 0:
        raise RuntimeError(f"protoc failed on {PROTO} (exit {code})")
    # A pool of its own: tritonclient's generated modules define the same `inference.*` names in the default pool,
    # and a process (the test session) may load both.
    messages = out / GENERATED[0]
    messages.write_text(messages.read_text().replace("_descriptor_pool.Default()", "_descriptor_pool.DescriptorPool()"))
    stub = out / GENERATED[1]
    stub.write_text(stub.read_text().replace("import inference_pb2 as", "from api.grpc import inference_pb2 as"))


def generated_text() -> dict[str, str]:
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        return {name: (Path(tmp) / name).read_text() for name in GENERATED}


if __name__ == "__main__":
    for name, text in generated_text().items():
        (HERE / name).write_text(text)
        print(f"wrote {HERE / name}", file=sys.stderr)
