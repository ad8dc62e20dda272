"""Shared helpers: render the chart with Helm's own engine (helm-python-sdk,
which wraps Helm's Go SDK — no helm binary) and parse the manifests."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "helm" / "mailpush"
RELEASE = "mp"
NAMESPACE = "mail"


class _NoDuplicateKeysLoader(yaml.SafeLoader):
    """PyYAML silently keeps the last of duplicate keys; Kubernetes may not.
    A duplicated env name in the ConfigMap would be a real bug, so fail."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_NoDuplicateKeysLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping
)


def parse_manifests(rendered: dict[str, str]) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.load_all(text, Loader=_NoDuplicateKeysLoader):
            if doc:
                assert isinstance(doc, dict), f"{path}: not a mapping"
                docs.append(doc)
    return docs


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


class Rendered:
    """The manifests of one rendering, with lookup helpers."""

    def __init__(self, rendered: dict[str, str]):
        self.raw = rendered
        self.docs = parse_manifests(rendered)

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] == kind]

    def one(self, kind: str) -> dict[str, Any]:
        found = self.of_kind(kind)
        assert len(found) == 1, f"expected one {kind}, found {len(found)}"
        return found[0]

    @property
    def sts(self) -> dict[str, Any]:
        return self.one("StatefulSet")

    @property
    def pod(self) -> dict[str, Any]:
        return self.sts["spec"]["template"]["spec"]

    @property
    def container(self) -> dict[str, Any]:
        containers = self.pod["containers"]
        assert [c["name"] for c in containers] == ["mailpush"]
        return containers[0]

    @property
    def env(self) -> dict[str, dict[str, Any]]:
        """Container env by name (duplicates are an error)."""
        names = [e["name"] for e in self.container.get("env", [])]
        assert len(names) == len(set(names)), f"duplicate env names: {names}"
        return {e["name"]: e for e in self.container.get("env", [])}

    @property
    def config(self) -> dict[str, str]:
        return self.one("ConfigMap")["data"]

    @property
    def notes(self) -> str:
        return next(v for k, v in self.raw.items() if k.endswith("NOTES.txt"))


@pytest.fixture(scope="session")
def chart():
    with helm.Chart.load(CHART_DIR) as loaded:
        yield loaded


@pytest.fixture(scope="session")
def render(chart):
    def _render(values: dict[str, Any] | None = None) -> Rendered:
        return Rendered(chart.render(values or {}, name=RELEASE, namespace=NAMESPACE))

    return _render


@pytest.fixture(scope="session")
def default_values() -> dict[str, Any]:
    with open(CHART_DIR / "values.yaml") as f:
        return yaml.safe_load(f)
