#!/usr/bin/env bash
# Runs every shell block of the user guide (docs/usage.md) on a small model, so the guide
# shows commands that work. Blocks:
#   ```sh                 run as is ($MODEL is the model; `glm5` is the binary under test)
#   ```sh server-start    started in the background; the next `server` blocks run against it
#   ```sh server / ```js server   run while that server listens (port 8080 in the text is
#                         replaced by a free port; js blocks run with node where the openai
#                         client is installed)
# A block right after a line `<!-- not-run: REASON -->` is skipped; at most a quarter may be.
#
# usage: run_guide.sh GUIDE GLM5_BINARY MODEL NODE_MODULES_DIR
set -uo pipefail
guide=$1 binary=$2 model=$3 node_dir=$(realpath "$4")

work=$(mktemp -d)
server_pid=""
cleanup() {
    [[ -n $server_pid ]] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
    rm -rf "$work"
    rm -f "$node_dir"/.guide-block-*.mjs
}
trap cleanup EXIT

mkdir -p "$work/bin"
ln -s "$(realpath "$binary")" "$work/bin/glm5"
export PATH="$work/bin:$PATH" MODEL="$model"

# A free loopback port for the guide's 8080.
port=""
for _ in $(seq 50); do
    p=$((20000 + RANDOM % 40000))
    if ! (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null; then port=$p; break; fi
done
[[ -n $port ]] || { echo "no free port"; exit 1; }

# Split the guide into blocks: $work/block-N.{info,body,skip}.
awk -v dir="$work" '
    /^<!-- not-run:/ { skip = $0; next }
    /^```/ && !inside { inside = 1; n++; info = substr($0, 4); print info > (dir "/block-" n ".info");
                        if (skip != "") print skip > (dir "/block-" n ".skip"); skip = ""; next }
    /^```/ && inside { inside = 0; close(dir "/block-" n ".body"); next }
    inside { print > (dir "/block-" n ".body"); next }
    NF { skip = "" }
' "$guide"

passed=0 failed=0 skipped=0 total=0
for info_file in $(ls "$work"/block-*.info | sort -t- -k2 -n); do
    base=${info_file%.info}
    info=$(cat "$info_file")
    name="block $(basename "$base" | cut -d- -f2) ($info)"
    [[ $info == sh* || $info == js* ]] || continue
    total=$((total + 1))
    if [[ -f $base.skip ]]; then
        echo "SKIP $name: $(sed 's/<!-- not-run: \(.*\) -->/\1/' "$base.skip")"
        skipped=$((skipped + 1))
        continue
    fi
    body=$(sed "s/8080/$port/g" "$base.body")
    ok=1
    case $info in
        "sh server-start")
            bash -c "$body" > "$work/server.log" 2>&1 &
            server_pid=$!
            for _ in $(seq 600); do
                grep -q "listening on" "$work/server.log" && break
                kill -0 "$server_pid" 2>/dev/null || break
                sleep 0.1
            done
            grep -q "listening on" "$work/server.log" || { ok=0; cat "$work/server.log"; }
            ;;
        "js server")
            f="$node_dir/.guide-block-$$.mjs"
            printf '%s\n' "$body" > "$f"
            (cd "$node_dir" && timeout 120 node "$f") > "$work/out" 2>&1 || ok=0
            rm -f "$f"
            ;;
        *)
            timeout 300 bash -e -o pipefail -c "$body" > "$work/out" 2>&1 || ok=0
            ;;
    esac
    if ((ok)); then
        echo "PASS $name"
        passed=$((passed + 1))
    else
        echo "FAIL $name:"
        sed 's/^/    /' "$work/out" 2>/dev/null | tail -n 30
        failed=$((failed + 1))
    fi
done
if ((skipped * 4 > total)); then
    echo "FAIL: $skipped of $total blocks are not run (at most a quarter may be)"
    failed=$((failed + 1))
fi
if ((total == 0)); then
    echo "FAIL: no blocks found in $guide"
    failed=$((failed + 1))
fi
echo "$passed passed, $failed failed, $skipped skipped"
((failed == 0))
