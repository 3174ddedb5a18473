"""A Dapr workflow application for stategate's tests, written with the Python SDK's workflow
runtime (dapr.ext.workflow). daprd runs the workflow on its actors, whose state store is
stategate.

Usage: workflow_app.py INSTANCE_ID ORDER_JSON

The app connects to daprd's gRPC port (DAPR_GRPC_PORT in the environment), registers the
workflow `order_flow` and its two activities, schedules one instance with the given id and
input, waits for it to finish, and prints one line `RESULT {"status": ..., "output": ...}`
(or `FAIL: ...`). Then it stops its worker and exits.
"""

import json
import os
import sys
import traceback

import dapr.ext.workflow as wf

runtime = wf.WorkflowRuntime()


@runtime.activity(name='reserve')
def reserve(ctx: wf.WorkflowActivityContext, order: dict) -> dict:
    return {'item': order['item'], 'reserved': order['qty']}


@runtime.activity(name='charge')
def charge(ctx: wf.WorkflowActivityContext, reservation: dict) -> dict:
    return {'item': reservation['item'], 'charged': reservation['reserved'] * 10}


@runtime.workflow(name='order_flow')
def order_flow(ctx: wf.DaprWorkflowContext, order: dict):
    reservation = yield ctx.call_activity(reserve, input=order)
    receipt = yield ctx.call_activity(charge, input=reservation)
    return {'reservation': reservation, 'receipt': receipt}


def main() -> int:
    instance_id, order = sys.argv[1], json.loads(sys.argv[2])
    timeout = int(os.environ.get('WORKFLOW_TIMEOUT', '60'))
    runtime.start()
    try:
        client = wf.DaprWorkflowClient()
        client.schedule_new_workflow(order_flow, input=order, instance_id=instance_id)
        print(f'SCHEDULED {instance_id}', flush=True)
        state = client.wait_for_workflow_completion(instance_id, timeout_in_seconds=timeout)
        if state is None:
            print(f'FAIL: {instance_id} did not finish within {timeout}s', flush=True)
            return 1
        result = {
            'status': state.runtime_status.name,
            'output': json.loads(state.serialized_output) if state.serialized_output else None,
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
