#!/usr/bin/env bash
# One-time setup on a fresh machine (Python 3.11, Java 17 and Maven installed):
#   - .venv with delayq and its pinned Python dependencies (from PyPI),
#   - .lib/spark, .lib/kafka, .lib/hdfs, .lib/s3 and .lib/s3proxy with the JVM jars, resolved by
#     Maven (from Maven Central); .lib/hdfs runs a local HDFS for a store on hdfs:// (`delayq hdfs
#     start`), .lib/s3 is S3A for a store on s3a://, .lib/s3proxy a local S3 server (`delayq s3`),
#   - Prometheus and libfaketime (Debian packages) for the metrics and clock tests.
# Safe to run again: each step is skipped when its inputs did not change.
# Nothing is downloaded after this: the job and the broker start from these folders.
set -euo pipefail
cd "$(dirname "$0")/.."

need() { command -v "$1" >/dev/null || { echo "setup: '$1' not found; $2" >&2; exit 1; }; }
need java "install a Java 17 runtime (Debian: apt-get install openjdk-17-jre-headless)"
need mvn "install Maven (Debian: apt-get install maven)"
PYTHON=${PYTHON:-python3}
need "$PYTHON" "install Python 3.11"

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
if [ ! -f .venv/.installed ] || [ pyproject.toml -nt .venv/.installed ]; then
  echo "setup: installing Python dependencies into .venv"
  .venv/bin/pip install -q --disable-pip-version-check -e '.[test,bench]'
  touch .venv/.installed
fi

# Debian packages the tests run: Prometheus (server and promtool) proves the dashboard's
# queries; libfaketime (faketime) shifts a test broker's clock against the job's host.
missing=()
{ command -v prometheus >/dev/null && command -v promtool >/dev/null; } || missing+=(prometheus)
compgen -G "/usr/lib/*/faketime/libfaketimeMT.so.1" >/dev/null || missing+=(faketime)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing Debian's ${missing[*]} package(s)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "setup: ${missing[*]} not found; install Debian's package(s): sudo apt-get install ${missing[*]}" >&2
    exit 1
  fi
fi

for part in spark kafka hdfs s3 s3proxy; do
  pom=deploy/maven/$part/pom.xml
  out=.lib/$part
  if [ ! -f "$out/.resolved" ] || [ "$pom" -nt "$out/.resolved" ]; then
    echo "setup: resolving $part jars with Maven into $out"
    rm -rf "$out"
    mvn -q -B -f "$pom" dependency:copy-dependencies -DoutputDirectory="$PWD/$out"
    touch "$out/.resolved"
  fi
done
# delayq's local file system for Hadoop (file modes without a `chmod` process per file),
# compiled by Maven against the Hadoop API pyspark ships; the job puts it on the class path.
localfs=deploy/maven/localfs
# Rebuilt only when its pom or source changed: a new jar means a new class data archive below.
if [ ! -f .lib/localfs/delayq-localfs.jar ] || [ -n "$(find "$localfs/pom.xml" "$localfs/src" -newer .lib/localfs/delayq-localfs.jar -type f)" ]; then
  echo "setup: building the local file system jar with Maven into .lib/localfs"
  rm -rf .lib/build/localfs
  mvn -q -B -f "$localfs/pom.xml" -Dbuild.dir="$PWD/.lib/build/localfs" package
  mkdir -p .lib/localfs
  cp .lib/build/localfs/delayq-localfs.jar .lib/localfs/delayq-localfs.jar
fi
# Class data sharing for the Spark driver JVM: its classes mapped from one archive instead of
# loaded from the jars at every start (streaming/spark/cds.py; about 3 s off each start). Once per
# Java and jar set; a JVM without a matching archive starts as before.
if ! .venv/bin/python -c 'import sys
from conf import load_settings
from streaming.spark.cds import archive_path
sys.exit(0 if archive_path(load_settings()).is_file() else 1)' 2>/dev/null; then
  echo "setup: building the Spark JVM class data archive into .lib/cds (about a minute)"
  .venv/bin/python -m streaming.tools.cds_train >.lib/cds-build.log 2>&1 || {
    echo "setup: the class data archive was not built (see .lib/cds-build.log); Spark starts without it" >&2; }
fi
echo "setup: ready (.venv, .lib/spark, .lib/kafka, .lib/hdfs, .lib/s3, .lib/s3proxy, .lib/localfs, .lib/cds)"
