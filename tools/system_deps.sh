#!/usr/bin/env bash
# The system packages the test suite needs, installed when missing (make test calls this; .ci/run through it): the code
# sandbox's boundary (rewards/sandbox.py) needs bubblewrap and libseccomp, so that the escape tests run. Only as root
# with apt-get; anywhere else (or when the install fails) nothing changes and it says what to install by hand.
if ! command -v bwrap >/dev/null 2>&1 || ! ldconfig -p 2>/dev/null | grep -q libseccomp.so.2; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "system: installing bubblewrap and libseccomp2 (the code sandbox's boundary)"
    (apt-get update -qq && apt-get install -y -qq bubblewrap libseccomp2 >/dev/null) \
      || echo "system: bubblewrap / libseccomp2 could not be installed: install them by hand (apt-get install bubblewrap libseccomp2)"
  else
    echo "system: bubblewrap / libseccomp2 missing: install them (apt-get install bubblewrap libseccomp2; Fedora: dnf install bubblewrap libseccomp) for the sandbox's tests"
  fi
fi
exit 0
