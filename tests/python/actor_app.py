"""A Dapr actor application for stategate's tests, written with the Python SDK's actor runtime
(dapr.actor served by the SDK's FastAPI extension under uvicorn).

Usage: actor_app.py PORT

daprd is started with --app-port PORT and calls this app for its actor types (/dapr/config) and
methods; the actors' state goes back through daprd (DAPR_HTTP_PORT in the environment) to the
actor state store, which is stategate. One actor type, `Counter`:

- `Add` (JSON number): adds it to the state `count`, records it as `last`, returns `Get`'s answer;
- `Get`: `{"count": ..., "last": ..., "note": ...}`, each null when the actor has no such state.
  `note` is never written by the actor: a device writes it over MQTT, the actor only reads it.
"""

import contextlib
import sys

import uvicorn
from dapr.actor import Actor, ActorInterface, actormethod
from dapr.ext.fastapi import DaprActor
from fastapi import FastAPI


class CounterInterface(ActorInterface):
    @actormethod(name='Add')
    async def add(self, amount: int) -> dict: ...

    @actormethod(name='Get')
    async def get(self) -> dict: ...


class Counter(Actor, CounterInterface):
    async def add(self, amount: int) -> dict:
        count = await self._state_manager.get_or_add_state('count', 0)
        await self._state_manager.set_state('count', count + amount)
        await self._state_manager.set_state('last', amount)
        # The runtime saves the changed state (one transaction through daprd) after the method.
        return await self.get()

    async def get(self) -> dict:
        out = {}
        for name in ('count', 'last', 'note'):
            present, value = await self._state_manager.try_get_state(name)
            out[name] = value if present else None
        return out


@contextlib.asynccontextmanager
async def lifespan(_app):
    # Registered before uvicorn reports that it is running, so daprd's first /dapr/config
    # already lists the type.
    await actors.register_actor(Counter)
    yield


app = FastAPI(title='stategate actor test app', lifespan=lifespan)
actors = DaprActor(app)


if __name__ == '__main__':
    uvicorn.run(app, host='127.0.0.1', port=int(sys.argv[1]), log_level='info')
