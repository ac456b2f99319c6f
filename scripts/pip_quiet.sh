# Sourced by setup.sh and setup_sglang_check.sh: `pip_install ARGS...` runs pip install quietly.
# Why: sglang and vllm are installed --no-deps (their full dependencies pull a CUDA torch), so every
# later pip run prints pip's "dependency resolver ... conflicts" report, dozens of lines of
# "vllm 0.33.0 requires X, which is not installed". They are expected: only the engines' argument
# parsers are used. This prints one line about them instead and keeps pip's full output in
# .venv/pip-install.log; pip's own exit status is kept, so a real failure still stops the setup.
pip_install() {
  local log=.venv/pip-install.log rc=0 n
  .venv/bin/python -m pip --disable-pip-version-check -q install "$@" >"$log.tmp" 2>&1 || rc=$?
  cat "$log.tmp" >>"$log"
  n=$(grep -c -E ' requires .*(, but you have .* which is incompatible|, which is not installed)\.$' "$log.tmp" || true)
  grep -v -E -e "^WARNING: Location '.*' is ignored" \
    -e "^ERROR: pip's dependency resolver does not currently take into account" \
    -e ' requires .*(, but you have .* which is incompatible|, which is not installed)\.$' "$log.tmp" || true
  rm -f "$log.tmp"
  if [ "$n" -gt 0 ]; then
    echo "setup: pip lists $n unmet requirement(s) of the --no-deps engine installs (sglang/vllm);" \
         "expected: only their argument parsers are used (details: $log)"
  fi
  return "$rc"
}
