# Sourced by the GPU-machine scripts: installs the carried wheels (.whl/) and this project into
# /tmp/site (that machine has no package index) and puts them on PYTHONPATH and PATH.
# Needs ROOT (the project root); writes the install log to ${INSTALL_LOG:-/tmp/cudasnap-install.log}.
SITE=/tmp/site
export PYTHONUNBUFFERED=1
if [ -d "$ROOT/.whl" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE "$ROOT"/.whl/*.whl || exit 2
fi
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
python3 -m pip install -q --no-deps --no-build-isolation --no-index --upgrade --target $SITE "$ROOT" \
  > "${INSTALL_LOG:-/tmp/cudasnap-install.log}" 2>&1 || { tail -30 "${INSTALL_LOG:-/tmp/cudasnap-install.log}"; exit 2; }
export PATH=$SITE/bin:$PATH:/usr/local/cuda/bin
