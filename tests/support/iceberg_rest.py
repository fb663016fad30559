"""SeaweedFS with its Iceberg REST catalog: the S3 gateway of objstore_servers.SeaweedFS
(same identities, same buckets) plus ``-s3.port.iceberg`` on a port of its own, and a table
bucket, the catalog's warehouse.

SeaweedFS's catalog keeps each table bucket (its S3 Tables) as one Iceberg warehouse: a
client names it as ``warehouse = "s3://<table bucket>"`` and the catalog answers
``/v1/config`` with that bucket as its prefix. The table bucket is created with ``weed
shell``'s ``s3tables.bucket -create`` (a plain S3 bucket of the same name is refused). The
catalog authenticates every call but ``/v1/config`` and ``/v1/oauth/tokens``: an OAuth2
client-credentials token for an S3 access key and secret (pyiceberg's ``credential =
"key:secret"``), or a SigV4 signature; the identity (by name) must own the table bucket or
be an Admin. Table metadata and data files are objects under the table bucket, read and
written through the S3 gateway."""

import json
import subprocess
import urllib.request

from objstore_servers import SeaweedFS
from ports import free_ports


class SeaweedIceberg(SeaweedFS):
    name = "SeaweedFS (Iceberg REST)"
    table_bucket = "danube-lake"
    # The table bucket's owner: the S3 identity the tests write with (SeaweedFS lets a
    # table bucket's owner, or an Admin identity, create namespaces and tables in it;
    # "danube", not owning it, gets 403 "not authorized to create namespace").
    account = "danube"

    def pick_ports(self):
        super().pick_ports()
        [self.extra_ports["iceberg"]] = free_ports(
            1, besides={self.port, *self.extra_ports.values()})

    @property
    def catalog_uri(self):
        return f"http://127.0.0.1:{self.extra_ports['iceberg']}"

    @property
    def warehouse(self):
        return f"s3://{self.table_bucket}"

    @property
    def credential(self):
        """pyiceberg's ``credential``: client id and secret of the OAuth2 token endpoint,
        here the S3 access key and secret."""
        return f"{self.access_key}:{self.secret_key}"

    def spawn(self, cmd):
        cmd = [f"-s3.port.iceberg={self.extra_ports['iceberg']}"
               if a == "-s3.port.iceberg=0" else a for a in cmd]
        return super().spawn(cmd)

    def probe(self):
        super().probe()
        with urllib.request.urlopen(f"{self.catalog_uri}/v1/config", timeout=2) as resp:
            json.load(resp)
        self._table_bucket()

    def _table_bucket(self):
        if getattr(self, "_lake_made", False):
            return              # kept in the data directory across a restart
        p = self.extra_ports
        done = subprocess.run(
            [self.binary, "shell", f"-master=127.0.0.1:{p['master']}.{p['master.grpc']}",
             f"-filer=127.0.0.1:{p['filer']}.{p['filer.grpc']}"],
            input=f"s3tables.bucket -create -name {self.table_bucket} "
                  f"-account {self.account}\nexit\n",
            capture_output=True, text=True, timeout=60)
        out = done.stdout + done.stderr
        if done.returncode != 0 or ("error" in out.lower() and "exist" not in out.lower()):
            raise RuntimeError(f"s3tables.bucket -create: {out.strip()}")
        self._lake_made = True

    def catalog_properties(self, **extra):
        """pyiceberg ``load_catalog(type="rest", ...)`` properties for the catalog."""
        return {"type": "rest", "uri": self.catalog_uri, "warehouse": self.warehouse,
                "credential": self.credential,
                "oauth2-server-uri": f"{self.catalog_uri}/v1/oauth/tokens",
                "s3.endpoint": self.endpoint,
                "s3.region": self.region, "s3.access-key-id": self.access_key,
                "s3.secret-access-key": self.secret_key, "s3.path-style-access": "true",
                **extra}
