#!/usr/bin/env bash
# Lighten the working tree that a device call carries (64 MiB with the carried paths) by
# leaving out the kept results that no device command reads, and put them back after.
#
#   bash scripts/device_tree.sh light      # benchmarks/results and docs/img stop travelling
#   ... device calls (scripts/split_device_parts.py sizes its chunks to the lighter tree) ...
#   bash scripts/device_tree.sh restore    # the index as HEAD has it again
#   bash scripts/device_tree.sh status     # light or not, and the bytes that travel
#
# `light` removes LIGHT_PATHS from the index only (`git rm --cached`: every file stays on disk,
# HEAD is untouched) and names them in .git/info/exclude, so they are neither tracked nor
# untracked-not-ignored, and a device call leaves them here. While light, a pre-commit hook
# refuses every commit (a commit then would delete the results from the branch). `restore`
# reads the paths back from HEAD into the index, drops the exclude lines and the hook.
# `light` refuses while anything is staged, so that `restore` has nothing of yours to undo.
set -euo pipefail
LIGHT_PATHS=(benchmarks/results docs/img)
MARK="# device_tree.sh light: from here"
END="# device_tree.sh light: to here"
root=$(git rev-parse --show-toplevel)
cd "$root"
# --git-path: right in a linked worktree too (hooks and info/exclude are the repository's)
exclude=$(git rev-parse --git-path info/exclude)
hook=$(git rev-parse --git-path hooks/pre-commit)

tree_bytes() {  # what a call carries of the tree: split_device_parts.py's count, one definition
  python3 -c 'import sys; from pathlib import Path; sys.path.insert(0, "scripts")
from split_device_parts import tree_bytes; print(tree_bytes(Path(".")))'
}
is_light() { [ -f "$exclude" ] && grep -qF "$MARK" "$exclude"; }

case ${1:-} in
  light)
    is_light && { echo "device_tree: already light ($(tree_bytes) bytes travel)"; exit 0; }
    git diff --cached --quiet || {
      echo "device_tree: something is staged; commit or unstage it first" >&2; exit 2; }
    [ -e "$hook" ] && { echo "device_tree: $hook exists; not replacing it" >&2; exit 2; }
    before=$(tree_bytes)
    mkdir -p "$(dirname "$exclude")" "$(dirname "$hook")"
    echo "$MARK" >>"$exclude"
    for path in "${LIGHT_PATHS[@]}"; do
      git rm -r -q --cached --ignore-unmatch -- "$path"
      echo "/$path/" >>"$exclude"
    done
    echo "$END" >>"$exclude"
    printf '#!/bin/sh\necho "the tree is light for device calls: bash scripts/device_tree.sh restore first" >&2\nexit 1\n' >"$hook"
    chmod +x "$hook"
    echo "device_tree: light: $before -> $(tree_bytes) bytes travel (${LIGHT_PATHS[*]} stay here)"
    ;;
  restore)
    is_light || { echo "device_tree: not light"; exit 0; }
    git reset -q HEAD -- "${LIGHT_PATHS[@]}"
    awk -v from="$MARK" -v to="$END" '$0 == from {skip = 1} !skip {print} $0 == to {skip = 0}' \
      "$exclude" >"$exclude.tmp"
    mv "$exclude.tmp" "$exclude"
    rm -f "$hook"
    echo "device_tree: restored: $(tree_bytes) bytes travel"
    ;;
  status)
    if is_light; then state=light; else state=full; fi
    echo "device_tree: $state, $(tree_bytes) bytes travel"
    ;;
  *)
    sed -n '2,15p' "$0" >&2
    exit 2
    ;;
esac
