#!/usr/bin/env bash
# A memoising front for one C compiler, for the test session only: tests/conftest.py puts a copy of it first on
# PATH under the compiler's name, with REAL and STORE filled in. Hundreds of tests build programs from the same
# kernel library with the same flags; gcc gives the same object for the same preprocessed text, flags and compiler,
# so a unit compiled once in a test run is copied from then on (as ccache does in its preprocessor mode).
#
#   cc OPTS -c X.c -o X.o        the object is memoised.
#   cc OPTS A.c B.c ... -o EXE   (sources only, no objects or libraries named by path) is run as gcc itself runs it:
#                                each source compiled alone (memoised), then one link with the same arguments, in
#                                the same order, with the objects in the sources' places.
#   anything else                (-E, -S, links of objects, --version, an argument it does not know) runs the real
#                                compiler unchanged.
# A failed compile is never stored, so a warning under -Werror fails every time, and its messages are printed as
# the real compiler prints them. The key: the real compiler (path, size, mtime), every option except the output's
# name and the preprocessor's -D/-U/-I (their whole effect is in the text), and the preprocessed text without the
# working-directory line that -g adds (each build compiles in its own scratch folder): so an object compiled with -g
# (the ASan builds) names the folder of the build that first compiled it in its debug info. Tests read no debug
# paths; the product's own object cache (stages/cross_compile.py, _PATH_FLAGS) never keeps such objects.
set -u
REAL=@REAL@
STORE=@STORE@

out="" compile=0 prev="" plain=1
args=()   # the arguments without `-o OUT`, in their order
srcs=()
for a in "$@"; do
    if [[ $prev == "-o" ]]; then
        out=$a; prev=""; continue
    fi
    case $a in
        -o) prev="-o"; continue ;;
        -o*) out=${a#-o}; continue ;;
        -c) compile=1 ;;
        -E|-S|-M|-MM|-MD|-MMD|-MF*|-MT*|-MQ*|-fsyntax-only|-save-temps*|-flto*|-fprofile*|'-###'|-v|--*) plain=0 ;;
        -dump*|-print*|-x*|-wrapper|-B*|-specs*) plain=0 ;;
        # options that write files besides the object (a hit would not write them), or name a .c that is no source
        -fdump-*|-fstack-usage|-fcallgraph-info*|-gsplit-dwarf|-Wa,*|-include|-imacros) plain=0 ;;
        -*) ;;
        *.c) srcs+=("$a") ;;
        *) plain=0 ;;  # an object, a library, an option's separate value, a response file: not ours to split
    esac
    args+=("$a")
done
if [[ $plain != 1 || -z $out || ${#srcs[@]} == 0 || ($compile == 1 && ${#srcs[@]} != 1) ]]; then
    exec "$REAL" "$@"
fi

# memo_compile SRC OBJ: `REAL OPTS -c SRC -o OBJ`, from the store when it can. OPTS: the call's options, without
# the link-only ones when the call links (gcc passes those to the linker only; with -c it would warn about them).
opts=()
for a in "${args[@]}"; do
    [[ $a == -* && $a != "-c" ]] || continue
    if [[ $compile != 1 ]]; then
        case $a in
            -l*|-L*|-Wl,*|-T*|-nostartfiles|-nostdlib|-nodefaultlibs|-static|-shared|-rdynamic|-pie|-no-pie) continue ;;
        esac
    fi
    opts+=("$a")
done
memo_compile() {
    local src=$1 obj=$2 key keyed=() a rc err tmp pp
    for a in "${opts[@]}"; do
        case $a in -D*|-U*|-I*) ;; *) keyed+=("$a") ;; esac
    done
    # a preprocessor that failed (or was killed) printed nothing to tell sources apart: compile, keep nothing
    pp=$(mktemp "$STORE/.pp.XXXXXX")
    if ! "$REAL" "${opts[@]}" -E "$src" -o "$pp" 2>/dev/null; then
        rm -f "$pp"
        "$REAL" "${opts[@]}" -c "$src" -o "$obj"
        return $?
    fi
    key=$({ stat -L -c '%n %s %Y' "$REAL"; printf '%s\n' "${keyed[@]}"
            sed -e '2{/^# 1 ".*\/\/"$/d}' "$pp"; } | sha256sum | cut -c1-64)
    rm -f "$pp"
    if [[ -f $STORE/$key.o ]] && cp "$STORE/$key.o" "$obj"; then
        cat "$STORE/$key.err" >&2 2>/dev/null
        return 0
    fi
    err=$(mktemp "$STORE/.err.XXXXXX")
    "$REAL" "${opts[@]}" -c "$src" -o "$obj" 2>"$err"
    rc=$?
    cat "$err" >&2
    if [[ $rc == 0 ]]; then
        tmp=$(mktemp "$STORE/.obj.XXXXXX")
        cp "$obj" "$tmp" && mv -f "$err" "$STORE/$key.err" && mv -f "$tmp" "$STORE/$key.o"
    fi
    rm -f "$err"
    return $rc
}

if [[ $compile == 1 ]]; then
    memo_compile "${srcs[0]}" "$out"
    exit $?
fi
work=$(mktemp -d "$STORE/.link.XXXXXX")
trap 'rm -rf "$work"' EXIT
link=()
n=0
worst=0
for a in "${args[@]}"; do
    if [[ $a != -* && $a == *.c ]]; then
        n=$((n + 1))
        memo_compile "$a" "$work/$n.o" || worst=$?   # every source, as gcc itself reports every one's errors
        link+=("$work/$n.o")
    else
        link+=("$a")
    fi
done
if [[ $worst != 0 ]]; then
    exit "$worst"
fi
"$REAL" "${link[@]}" -o "$out"
