"""What a stalled loader or test worker leaves in the log (``assert_each_stopped_worker_warned_once``): shared by
the pools' own tests and the training loader's and test pipeline's SIGSTOP tests."""
import re


def assert_each_stopped_worker_warned_once(records, pool, doing, timeout_key, timeout):
    """The log ``records`` warn once about each worker of the pool named ``pool`` that stopped while ``doing``
    (and at least one): pid, silence, process state and the timeout to come. (An idle worker stamps its clock
    about once a second, so under a tiny warning time an idle one may be warned about too.)"""
    warnings = [r.getMessage() for r in records if r.name == "lib.data.worker_pool"]
    stalled = [re.fullmatch(rf"data loader worker ({pool}-\d) \(pid \d+\) has shown no sign of life for \d+ s while "
                            rf"{re.escape(doing)}; the process is stopped \(SIGSTOP or Ctrl-Z\?\); stopping at "
                            rf"{re.escape(timeout_key)} \({timeout:g} s\) if it stays silent", w)
               for w in warnings if doing in w]
    assert stalled and all(stalled), warnings
    assert len({match.group(1) for match in stalled}) == len(stalled), warnings  # once per silence
