//! The plan recorder: the cache's [`Recorder`] that, instead of recording into a compute
//! pass, numbers the buffers, layouts, pipelines and bind groups it is handed and notes every
//! dispatch by those numbers.

use std::collections::HashMap;

use super::plan::{PlanBindGroup, PlanDispatch, PlanPass, PlanPipeline};
use super::wgsl::BindGroupLayoutDesc;
use crate::cache::{Bound, Recorder};
use crate::dispatch::{Dispatch, GridShape};
use crate::error::KvqError;
use crate::kernels::LayoutTable;

/// Records a cache's dispatches into a plan instead of a compute pass.
pub(super) struct PlanRecorder {
    pipes: HashMap<wgpu::ComputePipeline, (usize, &'static str, [LayoutTable; 2])>,
    pipeline: Option<wgpu::ComputePipeline>,
    groups: [Option<(wgpu::BindGroup, Vec<wgpu::Buffer>)>; 2],
    buffer_ids: HashMap<wgpu::Buffer, usize>,
    pub(super) buffers: Vec<(String, wgpu::Buffer)>,
    role_counts: HashMap<&'static str, usize>,
    layout_ids: HashMap<&'static str, usize>,
    pub(super) layouts: Vec<BindGroupLayoutDesc>,
    pipeline_ids: HashMap<wgpu::ComputePipeline, usize>,
    pub(super) pipelines: Vec<PlanPipeline>,
    group_ids: HashMap<wgpu::BindGroup, usize>,
    pub(super) bind_groups: Vec<PlanBindGroup>,
    pub(super) passes: Vec<PlanPass>,
    pub(super) error: Option<KvqError>,
}

impl PlanRecorder {
    /// A recorder for the pipelines of `pipes` (pipeline -> module index, entry point and the
    /// layouts of its bind groups 0 and 1), with nothing recorded yet.
    // wgpu's handles hash and compare by identity (not by their interior state), which is
    // what the recorder's maps key on.
    #[allow(clippy::mutable_key_type)]
    pub(super) fn new(
        pipes: HashMap<wgpu::ComputePipeline, (usize, &'static str, [LayoutTable; 2])>,
    ) -> PlanRecorder {
        PlanRecorder {
            pipes,
            pipeline: None,
            groups: [None, None],
            buffer_ids: HashMap::new(),
            buffers: Vec::new(),
            role_counts: HashMap::new(),
            layout_ids: HashMap::new(),
            layouts: Vec::new(),
            pipeline_ids: HashMap::new(),
            pipelines: Vec::new(),
            group_ids: HashMap::new(),
            bind_groups: Vec::new(),
            passes: Vec::new(),
            error: None,
        }
    }

    fn buffer(&mut self, name: impl FnOnce(&mut Self) -> String, b: &wgpu::Buffer) -> usize {
        if let Some(&i) = self.buffer_ids.get(b) {
            return i;
        }
        let name = name(self);
        self.buffers.push((name, b.clone()));
        self.buffer_ids.insert(b.clone(), self.buffers.len() - 1);
        self.buffers.len() - 1
    }

    /// Registers a caller buffer under its own name.
    pub(super) fn caller(&mut self, name: String, b: &wgpu::Buffer) -> usize {
        self.buffer(|_| name, b)
    }

    fn layout(&mut self, t: LayoutTable) -> usize {
        if let Some(&i) = self.layout_ids.get(t.0) {
            return i;
        }
        self.layouts.push(BindGroupLayoutDesc::of(t));
        self.layout_ids.insert(t.0, self.layouts.len() - 1);
        self.layouts.len() - 1
    }

    pub(super) fn begin(&mut self, label: String) {
        self.passes.push(PlanPass {
            label,
            dispatches: Vec::new(),
        });
        self.pipeline = None;
        self.groups = [None, None];
    }

    fn fail(&mut self, m: String) {
        self.error
            .get_or_insert(KvqError::Other(format!("recording a replay plan: {m}")));
    }

    fn try_dispatch(&mut self, workgroups: [u32; 3]) -> std::result::Result<(), String> {
        let pipe = self.pipeline.clone().ok_or("dispatch without a pipeline")?;
        let &(module, entry_point, tables) = self
            .pipes
            .get(&pipe)
            .ok_or("a pipeline kvq does not describe")?;
        let layouts = tables.map(|t| self.layout(t));
        let pipeline = match self.pipeline_ids.get(&pipe) {
            Some(&i) => i,
            None => {
                self.pipelines.push(PlanPipeline {
                    module,
                    entry_point,
                    layouts,
                });
                self.pipeline_ids.insert(pipe, self.pipelines.len() - 1);
                self.pipelines.len() - 1
            }
        };
        let mut bind_groups = [0; 2];
        for g in 0..2 {
            let (group, bufs) = self.groups[g]
                .clone()
                .ok_or(format!("dispatch without bind group {g}"))?;
            let table = tables[g];
            if table.1.len() != bufs.len() {
                return Err(format!(
                    "bind group {g} binds {} buffers, layout '{}' has {}",
                    bufs.len(),
                    table.0,
                    table.1.len()
                ));
            }
            bind_groups[g] = match self.group_ids.get(&group) {
                Some(&i) => {
                    if self.bind_groups[i].layout != layouts[g] {
                        return Err(format!("bind group {g} used with two layouts"));
                    }
                    i
                }
                None => {
                    let buffers = bufs
                        .iter()
                        .zip(table.1)
                        .map(|(b, &(_, _, role))| {
                            self.buffer(
                                |s| {
                                    let n = s.role_counts.entry(role).or_insert(0);
                                    *n += 1;
                                    format!("{role} {}", *n - 1)
                                },
                                b,
                            )
                        })
                        .collect();
                    self.bind_groups.push(PlanBindGroup {
                        layout: layouts[g],
                        buffers,
                    });
                    self.group_ids.insert(group, self.bind_groups.len() - 1);
                    self.bind_groups.len() - 1
                }
            };
        }
        let pass = self.passes.last_mut().ok_or("dispatch outside a pass")?;
        pass.dispatches.push(PlanDispatch {
            pipeline,
            bind_groups,
            workgroups,
            wide_groups: 0,
            queries: 1,
            query_groups: 1,
            row_tiles: 1,
            splits: 0,
        });
        Ok(())
    }
}

impl Recorder for PlanRecorder {
    fn set_pipeline(&mut self, pipeline: &wgpu::ComputePipeline) {
        self.pipeline = Some(pipeline.clone());
    }

    fn set_bind_group(&mut self, index: u32, group: &Bound) {
        match self.groups.get_mut(index as usize) {
            Some(slot) => *slot = Some((group.group.clone(), group.buffers.clone())),
            None => self.fail(format!("bind group index {index}")),
        }
    }

    fn dispatch_workgroups(&mut self, x: u32, y: u32, z: u32) {
        if let Err(m) = self.try_dispatch([x, y, z]) {
            self.fail(m);
        }
    }

    fn dispatch(&mut self, rule: &Dispatch, shape: &GridShape) {
        let [x, y, z] = rule.workgroups(shape);
        self.dispatch_workgroups(x, y, z);
        if let Some(d) = self.passes.last_mut().and_then(|p| p.dispatches.last_mut()) {
            d.wide_groups = shape.wide_groups;
            d.queries = shape.queries;
            d.query_groups = shape.query_groups;
            d.row_tiles = shape.row_tiles;
            d.splits = shape.splits;
        }
    }
}
