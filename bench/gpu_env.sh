# Sourced by the GPU-machine scripts: installs the carried wheels (.whl/) and this project into
# /tmp/site (that machine has no package index) and puts them on PYTHONPATH and PATH.
# Needs ROOT (the project root); writes the install log to ${INSTALL_LOG:-/tmp/cudasnap-install.log}.
SITE=/tmp/site
export PYTHONUNBUFFERED=1
# CUDASNAP_SITE_READY=1: installed already by the calling script (scripts run side by side share it)
if [ -n "${CUDASNAP_SITE_READY:-}" ]; then
  export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} PATH=$SITE/bin:$PATH:/usr/local/cuda/bin
  return 0 2>/dev/null || true
fi
if [ -d "$ROOT/.whl" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE "$ROOT"/.whl/*.whl || exit 2
fi
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
python3 -m pip install -q --no-deps --no-build-isolation --no-index --upgrade --target $SITE "$ROOT" \
  > "${INSTALL_LOG:-/tmp/cudasnap-install.log}" 2>&1 || { tail -30 "${INSTALL_LOG:-/tmp/cudasnap-install.log}"; exit 2; }
export PATH=$SITE/bin:$PATH:/usr/local/cuda/bin CUDASNAP_SITE_READY=1
