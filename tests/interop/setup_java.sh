#!/usr/bin/env bash
# Installs Apache Iceberg Java (1.10.2, Spark 3.5 runtime) beside the project, for the interop tests only:
# a venv of its own with pyspark 3.5.9 (the product is on pyspark 4.x), the Iceberg runtime and
# extensions jars from the wheel snowpark-connect-deps-iceberg, Debian's PostgreSQL/SQLite JDBC
# drivers, and a shim jar with the relocated Jackson the repackaged runtime jar lacks.
# usage: tests/interop/setup_java.sh [DIR]   (default: .venv-iceberg-java beside the project)
# Prints the path of the spark.jars list file it writes (DIR/jars.txt) on success.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${1:-$(cd "$here/../.." && pwd)/.venv-iceberg-java}
command -v java >/dev/null || { echo "java not found: the interop tests need Java 17" >&2; exit 1; }

need=()
[ -f /usr/share/java/postgresql.jar ] || need+=(libpostgresql-jdbc-java)
[ -f /usr/share/java/sqlite-jdbc.jar ] || need+=(libxerial-sqlite-jdbc-java)
[ -f /usr/share/java/jarjar.jar ] || need+=(libjarjar-java)
if [ ${#need[@]} -gt 0 ]; then
  (apt-get install -y -q "${need[@]}" >/dev/null 2>&1) || (apt-get update -q >/dev/null && apt-get install -y -q "${need[@]}" >/dev/null)
fi

[ -x "$dir/bin/python" ] || python3 -m venv "$dir"
"$dir/bin/python" -c 'import pyspark, snowpark_connect_deps_iceberg' 2>/dev/null \
  || "$dir/bin/pip" install -q 'pyspark==3.5.9' 'snowpark-connect-deps-iceberg==1.0.3'

site=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
jars="$site/snowpark_connect_deps_iceberg/jars"
shim="$dir/iceberg-shaded-jackson-2.15.2.jar"
[ -f "$shim" ] || bash "$here/build_jackson_shim.sh" "$site/pyspark/jars" "$shim" >/dev/null
printf '%s\n' "$jars/iceberg-spark-runtime-3.5_2.12-1.10.2.jar" "$jars/iceberg-spark-extensions-3.5_2.12-1.10.2.jar" \
  "$shim" /usr/share/java/postgresql.jar /usr/share/java/sqlite-jdbc.jar > "$dir/jars.txt"
for j in $(cat "$dir/jars.txt"); do [ -f "$j" ] || { echo "missing $j" >&2; exit 1; }; done
echo "$dir/jars.txt"
