#!/usr/bin/env bash
# Grafana's published dashboard schema as JSON Schema, and a validator, for the dashboard check
# (tests/test_grafana_schema.py):
#
# - @grafana/schema (npm) ships Grafana's dashboard model as TypeScript types generated from its
#   CUE kinds: `Dashboard` in dist/types/raw/dashboard/x/types.gen.d.ts is the classic JSON model
#   (schemaVersion 4x) that pdkit's provisioned dashboards use;
# - ts-json-schema-generator converts that type to JSON Schema (draft-07);
# - ajv-cli validates the generated dashboards against it.
#
# All three pinned, with their dependencies, by .ci/grafana-schema/package-lock.json (npm ci).
# Node and npm come from Debian (apt-get install nodejs npm) when missing. Idempotent: an
# installation matching the lock file is left as it is.
#
#     bash .ci/grafana-schema.sh        # -> ~/.cache/pdkit/grafana-schema/dashboard.schema.json
#
# PDKIT_GRAFANA_SCHEMA_HOME moves the installation (the test reads the same variable).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
HOME_DIR=${PDKIT_GRAFANA_SCHEMA_HOME:-$HOME/.cache/pdkit/grafana-schema}
TYPES=node_modules/@grafana/schema/dist/types/raw/dashboard/x/types.gen.d.ts

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "grafana-schema: needs node and npm (apt-get install nodejs npm); run as root" >&2
        exit 2
    fi
    export DEBIAN_FRONTEND=noninteractive
    APT_OPTS=(-o Acquire::Retries=3 -o Acquire::http::Timeout=30 -o Dpkg::Use-Pty=0)
    timeout 600 apt-get "${APT_OPTS[@]}" update -q
    timeout 1200 apt-get "${APT_OPTS[@]}" install -y -q --no-install-recommends nodejs npm
fi

mkdir -p "$HOME_DIR"
if ! cmp -s "$HERE/grafana-schema/package-lock.json" "$HOME_DIR/package-lock.json" \
    || [ ! -x "$HOME_DIR/node_modules/.bin/ajv" ] || [ ! -f "$HOME_DIR/$TYPES" ]; then
    cp "$HERE/grafana-schema/package.json" "$HERE/grafana-schema/package-lock.json" "$HOME_DIR/"
    # no install scripts: none of the three needs one
    (cd "$HOME_DIR" && timeout 600 npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
fi

cd "$HOME_DIR"
# --no-type-check: the .d.ts imports nothing outside itself; type-checking would need TypeScript's lib files
timeout 300 node_modules/.bin/ts-json-schema-generator --path "$TYPES" --type Dashboard --no-type-check \
    -o dashboard.schema.json.new
mv dashboard.schema.json.new dashboard.schema.json
echo "grafana-schema: $HOME_DIR/dashboard.schema.json from @grafana/schema $(node -p "require('./node_modules/@grafana/schema/package.json').version")"
