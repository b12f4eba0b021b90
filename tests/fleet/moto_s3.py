"""Runs a moto server (S3 and the rest of moto's AWS) that checks SigV4:
python tests/fleet/moto_s3.py --port P --access-key AK --secret-key SK

moto checks signatures only for access keys of IAM users it knows, and only
once its "initial no-auth action count" is used up. Before serving, this
creates the IAM user `tensorvault` with the given key pair (fixed, so a
restarted server accepts the same credentials) and an inline policy that
allows everything, then sets the count to 0: from the first request on, a
wrong secret is SignatureDoesNotMatch (403), an unknown key
InvalidAccessKeyId (403) and an unsigned request AccessDenied (403)."""
import argparse
import json
import sys

from moto import settings
from moto.core import DEFAULT_ACCOUNT_ID
from moto.iam.models import iam_backends
import moto.server

POLICY = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--access-key", required=True)
    ap.add_argument("--secret-key", required=True)
    ap.add_argument("--region", default="us-east-1")
    a = ap.parse_args()

    iam = iam_backends[DEFAULT_ACCOUNT_ID]["aws"]
    iam.create_user(a.region, "tensorvault")
    key = iam.create_access_key("tensorvault")
    key.access_key_id = a.access_key
    key.secret_access_key = a.secret_key
    iam.put_user_policy("tensorvault", "all", json.dumps(POLICY))
    settings.INITIAL_NO_AUTH_ACTION_COUNT = 0
    moto.server.main(["-H", a.host, "-p", str(a.port)])


if __name__ == "__main__":
    sys.exit(main())
