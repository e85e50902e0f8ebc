import { parseArgs } from 'node:util';
import { intFlag, numberFlag, untilSignal, UsageError, portFlag, DEFAULT_PORTS } from './args.ts';

export const ENV_SERVER_HELP = `Usage: rollout env-server --env <spec> [--env <spec> …] [options]

Serve environment modules over the env-server protocol (HTTP), so rollouts elsewhere can use them with
tasks[].env.http. Runs until Ctrl-C / SIGTERM.

  <spec> is name=modulePath[#export], builtin:<name>, or name=builtin:<name>[#export]:
    --env builtin:guess-number
    --env maze=./envs/maze.ts#createEnv      (paths relative to the current directory; default export: default)

Options:
  --env <spec>              an environment to serve (repeatable)
  --port <n>                port to listen on (default ${DEFAULT_PORTS['env-server']}; 0 = any free port)
  --host <addr>             address to bind (default 127.0.0.1)
  --params <json>           factory params: '{"max": 50}' for every environment, or 'name={"max": 50}' for one (repeatable)
  --max-body-bytes <n>      largest request body accepted, else 413 (default 1048576)
  --fail-first <n>          fault injection: answer the first n requests 503 (default 0)
  --fail-rate <p>           fault injection: fraction of requests answered 500 before anything is applied
  --hang-rate <p>           fault injection: fraction of requests never answered
  --drop-reply-rate <p>     fault injection: fraction of calls applied whose reply is dropped (connection closed)
  -h, --help                show this help

Routes: POST /{env}/{id}/reset, GET /{env}/{id}/get_task_prompt, POST /{env}/{id}/step,
GET /{env}/{id}/health|is_done|describe|render, DELETE /{env}/{id}, GET /envs.`;

export async function envServerCommand(argv: string[]): Promise<number> {
  const { values } = parseArgs({
    args: argv,
    options: {
      env: { type: 'string', multiple: true },
      port: { type: 'string' },
      host: { type: 'string' },
      params: { type: 'string', multiple: true },
      'max-body-bytes': { type: 'string' },
      'fail-first': { type: 'string' },
      'fail-rate': { type: 'string' },
      'hang-rate': { type: 'string' },
      'drop-reply-rate': { type: 'string' },
      help: { type: 'boolean', short: 'h' },
    },
    strict: true,
  });
  if (values.help) {
    console.log(ENV_SERVER_HELP);
    return 0;
  }
  const specs = values.env ?? [];
  if (specs.length === 0)
    throw new UsageError('--env is required (e.g. --env builtin:guess-number); see rollout env-server --help');

  const { startEnvServer } = await import('../env/server.ts');
  const { loadServedEnvs, parseEnvParams, resolveEnvModuleSpec } = await import('./env-specs.ts');
  const names = specs.map((spec) => resolveEnvModuleSpec(spec).name);
  const params = parseEnvParams(values.params ?? [], names);
  const envs = await loadServedEnvs(specs, params);
  const server = await startEnvServer({
    envs,
    port: portFlag(values.port) ?? DEFAULT_PORTS['env-server'],
    host: values.host ?? '127.0.0.1',
    maxBodyBytes: intFlag('max-body-bytes', values['max-body-bytes'], { min: 1 }),
    failFirst: intFlag('fail-first', values['fail-first']),
    failRate: numberFlag('fail-rate', values['fail-rate'], { max: 1 }),
    hangRate: numberFlag('hang-rate', values['hang-rate'], { max: 1 }),
    dropReplyRate: numberFlag('drop-reply-rate', values['drop-reply-rate'], { max: 1 }),
  });
  console.log(`env server listening on ${server.url} (envs: ${envs.map((e) => e.name).join(', ')})`);
  await untilSignal();
  await server.close();
  return 0;
}
