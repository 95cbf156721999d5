"""``make deploy-check``'s check of the KEDA manifests (deploy/kubernetes/keda.yaml), offline:
each document against KEDA's own schema for its kind, as the cloudcoil-models-keda package
ships it (models generated from the CRDs of the KEDA release it is versioned after), with
unknown fields refused, as kubernetes-validate --strict refuses them in the other files.

    build/validate/bin/python deploy/check_keda.py deploy/kubernetes/keda.yaml
"""

from __future__ import annotations

import sys
from typing import Any

import pydantic
import yaml
from cloudcoil.models.keda import v1alpha1


def strict_models() -> dict[str, type[pydantic.BaseModel]]:
    """KEDA's kinds, every model of the module refusing fields its schema does not have."""
    models = [m for m in vars(v1alpha1).values()
              if isinstance(m, type) and issubclass(m, pydantic.BaseModel)]
    for model in models:
        model.model_config["extra"] = "forbid"
    for model in models:
        model.model_rebuild(force=True)
    return {m.__name__: m for m in models}


def check(path: str, models: dict[str, type[pydantic.BaseModel]]) -> list[str]:
    errors = []
    with open(path) as f:
        docs: list[Any] = [d for d in yaml.safe_load_all(f) if d is not None]
    for n, doc in enumerate(docs, 1):
        kind = doc.get("kind") if isinstance(doc, dict) else None
        if doc.get("apiVersion") != "keda.sh/v1alpha1" or kind not in models:
            errors.append(f"{path}: document {n}: not a KEDA v1alpha1 kind ({kind!r})")
            continue
        try:
            models[kind].model_validate(doc)
        except pydantic.ValidationError as exc:
            for e in exc.errors():
                where = ".".join(str(p) for p in e["loc"])
                errors.append(f"{path}: {kind} {where}: {e['msg']}")
    return errors


def main() -> None:
    models = strict_models()
    errors = [e for path in sys.argv[1:] for e in check(path, models)]
    for e in errors:
        print(e, file=sys.stderr)
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
