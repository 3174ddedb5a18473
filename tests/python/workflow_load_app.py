"""Many Dapr workflows at once, for stategate's fault and limit tests (Python SDK workflow
runtime, dapr.ext.workflow). daprd runs the workflows on its actors, whose state store is
stategate.

Usage: workflow_load_app.py PREFIX COUNT STEPS [PAD_BYTES]

Starts the worker, schedules COUNT instances `PREFIX-0` .. `PREFIX-<COUNT-1>` of the workflow
`chain` (STEPS sequential calls of the activity `step`, each returning PAD_BYTES of padding
besides its result), prints `SCHEDULED <COUNT>`, then polls every instance until all have
ended and prints one line `RESULT {json}`:

- `completed`: instances COMPLETED with the expected output; `bad`: the others (first 20,
  with their status and output);
- `runs`: activity executions seen by this process; `reruns`: executions beyond the first of
  the same (instance, step) (activities are at least once: a crash between running one and
  storing its result runs it again); `never_ran`: (instance, step) pairs this process never
  ran (only possible if another process ran them);
- `poll_errors`: status calls that failed (daprd or the store away), retried.

With WORKFLOW_MODE=purge, the app instead purges the COUNT instances (deletes their state: daprd
needs a connected worker to host the workflow actors for it) and prints
`RESULT {"purged": <n>, "purge_errors": [...]}`.

Every activity execution prints `RAN <instance> <step>` so the test can strike in the middle.
The worker reconnects to daprd by itself (the SDK retries its work-item stream), and every
client call here is retried, so daprd and stategate may be killed and restarted meanwhile.
Environment: DAPR_GRPC_PORT (daprd), WORKFLOW_TIMEOUT (seconds for the whole run).
"""

import json
import os
import sys
import threading
import time
import traceback

import dapr.ext.workflow as wf

runtime = wf.WorkflowRuntime()
runs_lock = threading.Lock()
runs: dict = {}


@runtime.activity(name='step')
def step(ctx: wf.WorkflowActivityContext, job: dict) -> dict:
    key = (job['wf'], job['i'])
    with runs_lock:
        runs[key] = runs.get(key, 0) + 1
    print(f'RAN {job["wf"]} {job["i"]}', flush=True)
    # The mark is unique to this step of this instance: the test counts the history events
    # that carry it (the activity's result must be recorded once).
    return {'i': job['i'], 'mark': f'r{job["i"]}:{job["wf"]}', 'pad': 'x' * job['pad']}


@runtime.workflow(name='chain')
def chain(ctx: wf.DaprWorkflowContext, job: dict):
    total = 0
    for i in range(job['steps']):
        r = yield ctx.call_activity(step, input={'wf': job['wf'], 'i': i, 'pad': job['pad']})
        if r['mark'] != f'r{i}:{job["wf"]}':
            return {'error': f'step {i} returned {r["mark"]}'}
        total += i
    return {'final': f'done:{job["wf"]}', 'sum': total}


def retried(what, call, deadline):
    """Calls `call` until it answers or `deadline` passes (daprd may be restarting)."""
    while True:
        try:
            return call()
        except Exception as e:  # noqa: BLE001 - any failure of a client call is retried
            if time.monotonic() > deadline:
                raise RuntimeError(f'{what}: still failing at the deadline: {e}') from e
            time.sleep(0.5)


def main() -> int:
    prefix, count, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    pad = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    deadline = time.monotonic() + int(os.environ.get('WORKFLOW_TIMEOUT', '600'))
    runtime.start()
    try:
        client = wf.DaprWorkflowClient()
        ids = [f'{prefix}-{n}' for n in range(count)]
        if os.environ.get('WORKFLOW_MODE') == 'purge':
            purged, errors = 0, []
            for wid in ids:
                try:
                    # A few seconds for daprd to host the workflow actors once the worker connects.
                    retried(f'purge {wid}', lambda: client.purge_workflow(wid),
                            min(deadline, time.monotonic() + 30))
                    purged += 1
                except Exception as e:  # noqa: BLE001 - reported, the test asserts on it
                    errors.append(str(e))
            print('RESULT ' + json.dumps({'purged': purged, 'purge_errors': errors[:5]}), flush=True)
            return 0
        for wid in ids:
            job = {'wf': wid, 'steps': steps, 'pad': pad}
            retried(
                f'schedule {wid}',
                lambda: client.schedule_new_workflow(chain, input=job, instance_id=wid),
                deadline,
            )
        print(f'SCHEDULED {count}', flush=True)

        ended: dict = {}
        poll_errors = 0
        while len(ended) < count and time.monotonic() < deadline:
            for wid in ids:
                if wid in ended:
                    continue
                try:
                    state = client.get_workflow_state(wid, fetch_payloads=True)
                except Exception:  # noqa: BLE001 - daprd or the store away: poll again
                    poll_errors += 1
                    continue
                if state is not None and state.runtime_status.name in (
                    'COMPLETED', 'FAILED', 'TERMINATED'
                ):
                    ended[wid] = state
            print(f'PROGRESS {len(ended)}/{count}', flush=True)
            if len(ended) < count:
                time.sleep(0.5)

        expected_sum = steps * (steps - 1) // 2
        completed, bad = 0, []
        for wid in ids:
            state = ended.get(wid)
            if state is None:
                bad.append({'id': wid, 'status': 'NOT ENDED'})
                continue
            output = json.loads(state.serialized_output) if state.serialized_output else None
            want = {'final': f'done:{wid}', 'sum': expected_sum}
            if state.runtime_status.name == 'COMPLETED' and output == want:
                completed += 1
            else:
                failure = state.failure_details.message if state.failure_details else None
                bad.append(
                    {'id': wid, 'status': state.runtime_status.name, 'output': output,
                     'failure': failure}
                )
        with runs_lock:
            total_runs = sum(runs.values())
            reruns = sum(c - 1 for c in runs.values() if c > 1)
            never_ran = count * steps - len(runs)
        result = {
            'completed': completed,
            'bad': bad[:20],
            'bad_count': len(bad),
            'runs': total_runs,
            'reruns': reruns,
            'never_ran': never_ran,
            'poll_errors': poll_errors,
        }
        print('RESULT ' + json.dumps(result), flush=True)
        return 0
    except Exception:
        print('FAIL: ' + traceback.format_exc().replace('\n', ' | '), flush=True)
        return 1
    finally:
        runtime.shutdown()


if __name__ == '__main__':
    sys.exit(main())
