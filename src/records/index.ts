/** Step records: the append-only JSONL store of agent turns (writer in workers, reader for trainers). */
export {
  defaultStepFileName,
  sessionIdOf,
  StepRecordWriteError,
  StepRecordWriter,
  type EnvState,
  type FlushOptions,
  type SessionEnd,
  type SessionKey,
  type StepRecord,
  type StepRecordLine,
  type StepRecordWriterOptions,
  type StepRecordWriterStats,
} from './step-records.ts';
export {
  indexSessions,
  listCompletedSessions,
  readStepRecords,
  StepRecordFormatError,
  type CompletedSession,
  type ReadStats,
  type SessionIndex,
  type StepRecordStream,
  type TornLine,
} from './reader.ts';
