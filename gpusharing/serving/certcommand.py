"""`gpusharing certs`: the command line of certs.py (PEM files, a kustomize overlay, the API server's client
certificate) and of certgen.py (the Secret made and renewed in the cluster, the statements' signing key made once),
which both import certs.py."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from gpusharing.serving.certs import (
    API_SERVER_PATH,
    DATABASE_ENV,
    STATEMENT_KEY_FILE,
    STATEMENT_KEY_NAME,
    STATEMENT_KEY_SECRET,
    STATEMENT_VERIFIER_FILE,
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
from gpusharing.statements.note import NoteError, generate_signer

if TYPE_CHECKING:
    from gpusharing.serving.certgen import Target

MAX_DAYS = 3650  # ten years: beyond it a renewal is forgotten rather than planned


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    certs = subparsers.add_parser(
        "certs",
        help="make a CA and the webhook's serving certificate: in the cluster (the certgen Job), as a kustomize "
        "overlay, or as PEM files for local runs",
        description="Make a private CA and the webhook's serving certificate (ECDSA P-256, SHA-256).",
        epilog="examples:\n"
        "  gpusharing certs --format cluster --namespace gpusharing-system   # what the certgen Job runs\n"
        "  gpusharing certs --format cluster --no-certificate --statement-key-secret gpusharing-statement-key\n"
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
                       help="overlay: Secret and caBundle patch over --base, the database password and the "
                       "statements' signing key; pem: ca.crt, tls.crt, tls.key; cluster: the Secret made or renewed in "
                       "the cluster and the webhook configurations' caBundle patched "
                       "(through KUBECONFIG, else in-cluster), and the statements' signing key made; client-auth: the "
                       "API server's client certificate for the webhook (ca.crt for manifests/client-auth, apiserver/ "
                       "for the control plane's nodes)")
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
    certs.add_argument("--no-certificate", dest="certificate", action="store_false",
                       help="with --format cluster: leave the webhook's Secret and configurations alone (cert-manager "
                       "issues the certificate); with --statement-key-secret, make only that")
    certs.add_argument("--statement-key-secret", type=object_name, metavar="NAME",
                       help="with --format cluster: a Secret of --namespace made, where there is none, with a new key "
                       "to sign the statements of closed billing periods with (`key`) and its verifier key "
                       f"(`verifier`), e.g. {STATEMENT_KEY_SECRET}; one that exists is never read or changed")
    certs.add_argument("--statement-key-name", type=_key_name, metavar="KEYNAME",
                       help="with --statement-key-secret: the new key's name, as signatures show it (default "
                       f"{STATEMENT_KEY_NAME}, the statements' origin with TIMEKEEPER_CLUSTER_NAME's default)")
    certs.set_defaults(run=_certs)


def _key_name(raw: str) -> str:
    try:
        generate_signer(raw)  # checks the name as a signer key's
    except NoteError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return raw


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
        target = _cluster_target(args)
        from gpusharing.serving import certgen

        return certgen.main(target, args.days)
    if not (args.base / "kustomization.yaml").is_file():
        raise ConfigError(f"{args.base} holds no kustomization.yaml: give --base the path of manifests/base")
    output = write_overlay(args.namespace, args.base, args.output, args.days)
    print(f"wrote {output}/ (Secret {WEBHOOK_SECRET}, the caBundle of both webhook configurations, {DATABASE_ENV}, "
          f"the statements' signing key {STATEMENT_KEY_FILE})")
    print(f"publish the verifier key in {output}/{STATEMENT_VERIFIER_FILE}; install with: kubectl apply -k {output}")
    return 0


def _cluster_target(args: argparse.Namespace) -> Target:
    """What the certgen keeps, from options checked together."""
    if args.statement_key_name and not args.statement_key_secret:
        raise ConfigError("--statement-key-name names the key --statement-key-secret makes: give its Secret too")
    if not args.certificate and not args.statement_key_secret:
        raise ConfigError("--no-certificate leaves nothing to do without --statement-key-secret")
    from gpusharing.serving.certgen import StatementKey, Target  # the Kubernetes client, for this format alone

    key = (
        StatementKey(args.statement_key_secret, args.statement_key_name or STATEMENT_KEY_NAME)
        if args.statement_key_secret
        else None
    )
    return Target(args.namespace, args.service, args.secret, args.webhook_configuration, args.owner, args.certificate,
                  key)
