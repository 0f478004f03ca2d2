"""The kustomize install's files are the Helm chart's, rendered (`make manifests`, release/manifests.py): the chart is
the one source, and the committed manifests/ must be what it renders now."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from release import manifests
from tests.kustomize import MANIFESTS


def test_the_committed_manifests_are_what_the_chart_renders() -> None:
    """The drift check: a change to the chart without `make manifests` (or an edit of a rendered file) fails here."""
    differences = manifests.drift()
    assert not differences, ("manifests/ is not what charts/kube-gpusharing renders: run `make manifests` and commit "
                             "the result\n" + "\n".join(f"  manifests/{line}" for line in differences))


def test_the_drift_check_sees_an_edited_a_missing_and_a_stale_file(tmp_path: Path) -> None:
    copy = tmp_path / "manifests"
    shutil.copytree(MANIFESTS, copy)
    assert manifests.drift(copy) == []
    rbac = copy / "base" / "rbac.yaml"
    rbac.write_text(rbac.read_text().replace('verbs: ["create"]', 'verbs: ["create", "delete"]', 1))
    (copy / "crds" / "crds.yaml").unlink()
    (copy / "base" / "old.yaml").write_text(f"{manifests.MARK} from a template since removed\n")
    assert manifests.drift(copy) == [
        "base/rbac.yaml: differs from what the chart renders",
        "crds/crds.yaml: missing",
        "base/old.yaml: generated once, no longer rendered (remove it)",
    ]
    assert manifests.write(copy) == ["wrote base/rbac.yaml", "wrote crds/crds.yaml", "removed base/old.yaml"]
    assert manifests.drift(copy) == []


def test_every_rendered_file_says_it_is_generated_from_what_and_how_and_carries_no_helm_label() -> None:
    rendered = manifests.render()
    copies = {"base/gpu-models.yaml", "monitoring/dashboard.json"}  # taken as they are: the shipped catalogue, JSON
    for path, content in rendered.items():
        text = content.decode()
        if path in copies:
            continue
        first, second = text.splitlines()[:2]
        assert first.startswith(f"{manifests.MARK} (release/manifests.py) from charts/kube-gpusharing/"), path
        assert "Do not edit: change the chart and run `make manifests`." in second, path
        for obj in (o for o in yaml.safe_load_all(text) if o):
            labels = obj["metadata"].get("labels", {})
            assert not [
                label
                for label in labels
                if label.startswith("helm.sh/") or label.startswith("app.kubernetes.io/managed")
            ], path
            assert labels["app.kubernetes.io/part-of"] == "kube-gpusharing", path
    listed = {
        str(p.relative_to(MANIFESTS))
        for p in MANIFESTS.glob("*/*")
        if p.name != "kustomization.yaml" and p.parent.name != "examples"
    }
    assert listed - {"base/kustomizeconfig.yaml"} == set(rendered)  # every resource file of the install is rendered


def test_the_rendered_files_keep_the_comments_that_say_why() -> None:
    rbac = (MANIFESTS / "base" / "rbac.yaml").read_text()
    assert (
        "# Idle pods' Events also go on their owner as `kubectl describe` shows it: a ReplicaSet's Deployment." in rbac
    )
    assert "kubectl -n gpusharing-system create token gpusharing-budget-admin --audience gpusharing-timekeeper" in rbac
    assert "automountServiceAccountToken: false  # its tokens are made on request" in rbac
