#!/usr/bin/env bash
# Install the real qmd CLI (@tobilu/qmd) and a Bun runtime into <repo>/.tools (git-ignored),
# and write the launcher <repo>/.tools/bin/qmd that the tests and `memory.qmd.command` can use.
#
#   bash scripts/install-qmd.sh          # install or verify; prints the launcher path last
#
# - npm installs @tobilu/qmd@$QMD_VERSION and bun@$BUN_VERSION into <repo>/.tools/qmd.
#   The `bun` npm package carries the Bun binary through its platform optionalDependency
#   (@oven/bun-<os>-<arch>), so npm picks the right one on Linux and macOS.
# - The launcher runs dist/cli/qmd.js with `node` when the node on PATH is >= 22, else with the
#   Bun binary (qmd then uses Bun's built-in SQLite). It uses `exec`, so signals sent to the
#   launcher reach the runtime directly and there is no extra process in between.
# - Idempotent: when the installed versions already match and the Bun binary runs, npm is skipped.
# Needs: node and npm on PATH, and the npm registry.
set -euo pipefail

QMD_VERSION="2.8.3"
BUN_VERSION="1.4.5"

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
repo_root="$(cd "$script_dir/.." && pwd -P)"
tools_dir="$repo_root/.tools"
prefix="$tools_dir/qmd"
bin_dir="$tools_dir/bin"
launcher="$bin_dir/qmd"
entry_rel="node_modules/@tobilu/qmd/dist/cli/qmd.js"

log() { printf '%s\n' "install-qmd: $*" >&2; }
die() { log "error: $*"; exit 1; }

command -v node >/dev/null 2>&1 || die "node is not on PATH (npm needs it to install qmd)"
command -v npm >/dev/null 2>&1 || die "npm is not on PATH"

# Version of an installed package, or empty when it is absent.
installed_version() {
  local pkg_json="$prefix/node_modules/$1/package.json"
  [[ -f "$pkg_json" ]] || return 0
  node -e 'process.stdout.write(String(JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")).version || ""))' \
    "$pkg_json" 2>/dev/null || true
}

# Path (relative to $prefix) of a Bun binary that runs and reports $BUN_VERSION, or empty.
# bun/bin/bun.exe is the real binary once bun's postinstall has run; when install scripts are
# blocked it is a placeholder, and the binary is still in the platform package @oven/bun-*.
find_bun() {
  local candidate rel
  for candidate in "$prefix/node_modules/bun/bin/bun.exe" "$prefix"/node_modules/@oven/bun-*/bin/bun; do
    [[ -f "$candidate" && -x "$candidate" ]] || continue
    if [[ "$("$candidate" --version 2>/dev/null || true)" == "$BUN_VERSION" ]]; then
      rel="${candidate#"$prefix"/}"
      printf '%s' "$rel"
      return 0
    fi
  done
  return 0
}

bun_rel=""
if [[ "$(installed_version @tobilu/qmd)" == "$QMD_VERSION" && "$(installed_version bun)" == "$BUN_VERSION" \
      && -f "$prefix/$entry_rel" ]]; then
  bun_rel="$(find_bun)"
fi

if [[ -z "$bun_rel" ]]; then
  log "installing @tobilu/qmd@$QMD_VERSION and bun@$BUN_VERSION into $prefix"
  mkdir -p "$prefix"
  npm install --prefix "$prefix" --no-audit --no-fund --save-exact \
    "@tobilu/qmd@$QMD_VERSION" "bun@$BUN_VERSION" >&2
  [[ "$(installed_version @tobilu/qmd)" == "$QMD_VERSION" ]] || die "@tobilu/qmd@$QMD_VERSION did not install"
  [[ -f "$prefix/$entry_rel" ]] || die "missing $prefix/$entry_rel after install"
  bun_rel="$(find_bun)"
  [[ -n "$bun_rel" ]] || die "no working Bun $BUN_VERSION binary under $prefix/node_modules (bun/bin/bun.exe or @oven/bun-*/bin/bun)"
else
  log "qmd $QMD_VERSION and bun $BUN_VERSION already installed in $prefix"
fi

mkdir -p "$bin_dir"
tmp_launcher="$(mktemp "$bin_dir/.qmd.XXXXXX")"
cat >"$tmp_launcher" <<EOF
#!/bin/sh
# qmd $QMD_VERSION launcher written by scripts/install-qmd.sh (runtime: node >= 22, else bun $BUN_VERSION).
# Paths are relative to this file (symlinks to it are followed), so the repository can move.
# exec: signals reach the runtime.
self="\$0"
while [ -L "\$self" ]; do
  link="\$(readlink "\$self")"
  case "\$link" in
    /*) self="\$link" ;;
    *) self="\${self%/*}/\$link" ;;
  esac
done
case "\$self" in
  */*) here="\${self%/*}" ;;
  *) here=. ;;
esac
root="\$(cd "\$here/../qmd" 2>/dev/null && pwd -P)" || { echo "qmd launcher: missing \$here/../qmd" >&2; exit 127; }
entry="\$root/$entry_rel"
if command -v node >/dev/null 2>&1; then
  v="\$(node --version 2>/dev/null || true)"
  v="\${v#v}"
  major="\${v%%.*}"
  case "\$major" in ''|*[!0-9]*) major=0 ;; esac
  if [ "\$major" -ge 22 ]; then
    exec node "\$entry" "\$@"
  fi
fi
exec "\$root/$bun_rel" "\$entry" "\$@"
EOF
chmod 755 "$tmp_launcher"
mv -f "$tmp_launcher" "$launcher"

version_line="$("$launcher" --version 2>&1 || true)"
[[ "$version_line" == "qmd $QMD_VERSION"* ]] || die "launcher check failed: '$launcher --version' printed '$version_line'"
log "ok: $version_line"
printf '%s\n' "$launcher"
