"""`gpusharing certs`: the command line of certs.py (PEM files, a kustomize overlay, the API server's client
certificate) and of certgen.py (the Secret made and renewed in the cluster), which both import certs.py."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpusharing.serving.certs import (
    API_SERVER_PATH,
    DATABASE_ENV,
    WEBHOOK_CONFIGURATION,
    WEBHOOK_SECRET,
    WEBHOOK_SERVICE,
    make_serving_certificate,
    service_names,
    write_client_auth,
    write_overlay,
)
from gpusharing.settings.arguments import host_name, namespace, object_name, whole_number
from gpusharing.settings.env import ConfigError

MAX_DAYS = 3650  # ten years: beyond it a renewal is forgotten rather than planned


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    certs = subparsers.add_parser(
        "certs",
        help="make a CA and the webhook's serving certificate: in the cluster (the certgen Job), as a kustomize "
        "overlay, or as PEM files for local runs",
        description="Make a private CA and the webhook's serving certificate (ECDSA P-256, SHA-256).",
        epilog="examples:\n"
        "  gpusharing certs --format cluster --namespace gpusharing-system   # what the certgen Job runs\n"
        "  gpusharing certs --namespace gpusharing-system     # writes manifests/local-certs/, then:\n"
        "  kubectl apply -k manifests/local-certs\n"
        "  gpusharing certs --format pem --output /tmp/tls --name localhost --name 127.0.0.1\n"
        "  gpusharing certs --format client-auth --output manifests/client-auth",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    certs.add_argument("--namespace", default="gpusharing-system", type=namespace, help="where the webhook runs")
    certs.add_argument("--base", default="manifests/base", type=Path, help="the manifests to overlay")
    certs.add_argument(
        "--output", default="manifests/local-certs", type=Path, help="the overlay's (or PEM files') directory"
    )
    certs.add_argument("--days", type=whole_number(1, MAX_DAYS), default=365,
                       help=f"validity of the certificate, 1 to {MAX_DAYS} (default 365); of the CA too, except with "
                       "--format cluster, whose CA lives ten times as long")
    certs.add_argument("--format", choices=("overlay", "pem", "cluster", "client-auth"), default="overlay",
                       help="overlay: Secret and caBundle patch over --base; pem: ca.crt, tls.crt, tls.key; cluster: "
                       "the Secret made or renewed in the cluster and the webhook configurations' caBundle patched "
                       "(through KUBECONFIG, else in-cluster); client-auth: the API server's client certificate for "
                       "the webhook (ca.crt for manifests/client-auth, apiserver/ for the control plane's nodes)")
    certs.add_argument(
        "--apiserver-path",
        default=API_SERVER_PATH,
        help=f"with --format client-auth: where the control plane's nodes keep apiserver/'s files "
        f"(default {API_SERVER_PATH})",
    )
    certs.add_argument("--name", action="append", default=[], type=host_name,
                       help="with --format pem: a DNS name or IP to certify (repeatable)")
    certs.add_argument("--service", default=WEBHOOK_SERVICE, type=object_name,
                       help=f"with --format cluster: the webhook's Service (default {WEBHOOK_SERVICE})")
    certs.add_argument("--secret", default=WEBHOOK_SECRET, type=object_name,
                       help=f"with --format cluster: the webhook's kubernetes.io/tls Secret (default {WEBHOOK_SECRET})")
    certs.add_argument("--webhook-configuration", default=WEBHOOK_CONFIGURATION, type=object_name, metavar="NAME",
                       help="with --format cluster: the name of the mutating and the validating webhook configuration "
                       f"(default {WEBHOOK_CONFIGURATION})")
    certs.add_argument("--owner", type=object_name, metavar="SERVICEACCOUNT",
                       help="with --format cluster: a ServiceAccount of --namespace whose deletion deletes the Secret "
                       "(the certgen's own, so that uninstalling leaves nothing behind)")
    certs.set_defaults(run=_certs)


def _certs(args: argparse.Namespace) -> int:
    if args.format == "client-auth":
        output = write_client_auth(args.namespace, args.output, args.days, args.apiserver_path)
        print(f"wrote {output}/ca.crt (for components: [client-auth]) and {output}/apiserver/ (keep it secret)")
        print(
            f"on every control plane node: copy {output}/apiserver/*.yaml into {args.apiserver_path}/ and run "
            f"kube-apiserver with --admission-control-config-file={args.apiserver_path}/admission-configuration.yaml"
        )
        return 0
    if args.format == "pem":
        names = args.name or service_names(args.namespace)
        make_serving_certificate(names, args.days).write(args.output)
        print(f"wrote {args.output}/ca.crt, tls.crt, tls.key for {', '.join(names)}")
        return 0
    if args.format == "cluster":
        from gpusharing.serving import certgen  # the Kubernetes client, for this format alone

        target = certgen.Target(args.namespace, args.service, args.secret, args.webhook_configuration, args.owner)
        return certgen.main(target, args.days)
    if not (args.base / "kustomization.yaml").is_file():
        raise ConfigError(f"{args.base} holds no kustomization.yaml: give --base the path of manifests/base")
    output = write_overlay(args.namespace, args.base, args.output, args.days)
    print(f"wrote {output}/ (Secret {WEBHOOK_SECRET}, the caBundle of both webhook configurations, {DATABASE_ENV})")
    print(f"install with: kubectl apply -k {output}")
    return 0
